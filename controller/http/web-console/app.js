// The console's entry: tabs (kept in the URL's hash), the API key, and the views.
// `#job/ID` is the Generate tab with that job beside the form.
import { getKey, setKey } from "./api.js";
import { $, dismissAll } from "./dom.js";
import * as generate from "./generate.js";
import * as job from "./job.js";
import * as queue from "./queue.js";
import * as realtime from "./realtime.js";
import * as workers from "./workers.js";

const VIEWS = { generate, queue, workers, realtime };

function show(tab, arg) {
  const jobId = tab === "job" ? arg : "";
  if (tab === "job") tab = "generate";
  if (!(tab in VIEWS)) tab = "generate";
  for (const name of Object.keys(VIEWS)) {
    $(`tab-${name}`).hidden = name !== tab;
    document.querySelector(`#tabs [data-tab="${name}"]`).classList.toggle("active", name === tab);
  }
  VIEWS[tab].show(arg);
  if (tab === "generate") job.show(jobId);
}

function route() {
  const [tab, arg] = location.hash.slice(1).split("/", 2);
  show(tab || "generate", arg ? decodeURIComponent(arg) : "");
}

function keyState() {
  $("key-state").textContent = getKey() ? "key set for this tab" : "no key";
}

document.querySelectorAll("#tabs button").forEach((button) =>
  button.addEventListener("click", () => {
    location.hash = button.dataset.tab;
  }),
);
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setKey($("api-key").value.trim());
  $("api-key").value = "";
  dismissAll(); // an error of the last key is not one of this key
  keyState();
  route(); // reload the current view's data with the new key
});
window.addEventListener("hashchange", route);
for (const view of [...Object.values(VIEWS), job]) view.init();
keyState();
route();
