// The console's entry: tabs (kept in the URL's hash), the API key, and the views.
import { getKey, setKey } from "./api.js";
import { $ } from "./dom.js";
import * as generate from "./generate.js";
import * as job from "./job.js";
import * as queue from "./queue.js";
import * as realtime from "./realtime.js";
import * as workers from "./workers.js";

const VIEWS = { generate, job, queue, workers, realtime };

function show(tab, arg) {
  if (!(tab in VIEWS)) tab = "generate";
  for (const name of Object.keys(VIEWS)) {
    $(`tab-${name}`).hidden = name !== tab;
    document.querySelector(`#tabs [data-tab="${name}"]`).classList.toggle("active", name === tab);
  }
  VIEWS[tab].show(arg);
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
  $("banner").hidden = true; // an error of the last key is not one of this key
  keyState();
  route(); // reload the current view's data with the new key
});
window.addEventListener("hashchange", route);
for (const view of Object.values(VIEWS)) view.init();
keyState();
route();
