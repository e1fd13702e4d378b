// Workers: the workers (an admin's view: ListWorkers needs an admin key) and where models are warm.
import { api } from "./api.js";
import { $, banner, clear, el, short } from "./dom.js";
import { byServed } from "./generate.js";

function workerRow(w) {
  const drain =
    short(w.state, "WORKER_STATE_") === "ready"
      ? el("button", { type: "button", className: "drain", onclick: () => drainWorker(w.id) }, "Drain")
      : "";
  return el(
    "tr",
    { dataset: { worker: w.id } },
    el("td", {}, w.id),
    el("td", {}, short(w.state, "WORKER_STATE_")),
    el("td", {}, w.execution_mode),
    el("td", { className: "warm" }, (w.loaded_models || []).join(", ")),
    el("td", {}, (w.models || []).join(", ")),
    el("td", {}, `${w.busy_slots} / ${w.slots}`),
    el("td", {}, drain),
  );
}

function modelRow(m) {
  return el(
    "tr",
    { dataset: { model: m.id } },
    el("td", {}, m.id),
    el("td", {}, (m.tasks || []).map((t) => short(t, "TASK_")).join(", ")),
    el("td", {}, String(m.serving_workers || 0)),
    el("td", {}, (m.warm_on || []).map((w) => w.worker_id).join(", ")),
  );
}

async function load() {
  const denied = $("w-denied");
  try {
    const answer = await api("GET", "/v1/workers");
    denied.hidden = true;
    $("w-workers").hidden = false;
    clear($("w-workers").tBodies[0]).append(...(answer.workers || []).map(workerRow));
  } catch (error) {
    clear($("w-workers").tBodies[0]); // a key that cannot list workers sees none, and no drain
    $("w-workers").hidden = true;
    denied.hidden = false;
    denied.textContent =
      error.status === 403
        ? `The workers list and drain need an admin key (${error.code}: ${error.message}).`
        : `Listing workers: ${error}`;
  }
  try {
    const answer = await api("GET", "/v1/omnirt/models");
    clear($("w-models").tBodies[0]).append(...(answer.models || []).sort(byServed).map(modelRow));
  } catch (error) {
    banner(`Listing models: ${error}`);
  }
}

async function drainWorker(id) {
  if (!confirm(`Drain ${id}? It finishes its jobs and takes no new ones.`)) return;
  try {
    await api("POST", `/v1/workers/${encodeURIComponent(id)}/drain`);
    banner(`Draining ${id}`, false);
  } catch (error) {
    banner(`Draining ${id}: ${error}`);
  }
  await load();
}

export function init() {
  $("w-refresh").addEventListener("click", load);
}

export function show() {
  load();
}
