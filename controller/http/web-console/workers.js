// Workers: one card per connected worker (ListWorkers needs an admin key): its slots, the jobs it
// ran (the worker's own counts since it started), its device, the models it holds warm and their
// memory, its heartbeat, and a drain button. The model catalog is folded away below.
import { api } from "./api.js";
import { $, ago, bytes, clear, el, fail, note, ok, short } from "./dom.js";
import { byServed } from "./generate.js";

let timer = null;

function item(label, ...value) {
  return [el("dt", {}, label), el("dd", { dataset: { field: label } }, ...value)];
}

function card(w, memory) {
  const state = short(w.state, "WORKER_STATE_");
  const drain =
    state === "ready"
      ? el("button", { type: "button", className: "drain", onclick: () => drainWorker(w.id) }, "Drain")
      : "";
  const warm = (w.loaded_models || []).map((m) =>
    el("tr", { dataset: { model: m } }, el("td", {}, m), el("td", {}, bytes((memory.get(m) || new Map()).get(w.id)) || "not measured")),
  );
  const running = (w.running_job_ids || []).map((id) => el("a", { href: `#job/${encodeURIComponent(id)}`, className: "mono" }, id));
  return el(
    "article",
    { className: "card", dataset: { worker: w.id, state } },
    el("div", { className: "card-head" }, el("h4", {}, w.id), el("span", { className: "badge", dataset: { state } }, state), drain),
    el(
      "dl",
      { className: "summary" },
      item("Slots", el("span", { className: "slots" }, `${w.busy_slots || 0} / ${w.slots} busy`)),
      // uint64 counts arrive as JSON strings.
      item(
        "Jobs",
        el("span", { className: "jobs" }, `${Number(w.jobs_succeeded || 0)} done · ${Number(w.jobs_failed || 0)} failed`),
        el("span", { className: "muted" }, " (since the worker started)"),
      ),
      item("Device", `${w.device || "?"} · ${w.backend || "?"} backend`),
      item("Mode", w.execution_mode + (w.step_rows ? ` · step engine, ${w.step_rows} rows` : "")),
      item("Heartbeat", el("span", { className: "heartbeat" }, ago(w.last_heartbeat_at) || "-")),
      item("Connected", `${ago(w.connected_at)} · ${w.hostname || "?"} pid ${w.pid || "?"} · ${w.version || ""}`),
      running.length ? item("Running", ...running.flatMap((a, i) => (i ? [" ", a] : [a]))) : [],
    ),
    el("h5", {}, "Warm models"),
    warm.length
      ? el("table", { className: "warm" }, el("thead", {}, el("tr", {}, el("th", {}, "Model"), el("th", {}, "Memory"))), el("tbody", {}, warm))
      : el("p", { className: "muted warm" }, "none loaded"),
    el("p", { className: "muted" }, `Serves: ${(w.models || []).join(", ")}`),
    (w.unknown_models || []).length ? el("p", { className: "warning" }, `Not in the catalog: ${w.unknown_models.join(", ")}`) : "",
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
  let models = [];
  try {
    models = (await api("GET", "/v1/omnirt/models")).models || [];
    ok("workers", "models");
  } catch (error) {
    fail("workers", `Listing models: ${error}`, "models");
  }
  const memory = new Map(); // model -> worker -> bytes
  for (const m of models) memory.set(m.id, new Map((m.warm_on || []).map((w) => [w.worker_id, w.memory_bytes])));
  try {
    const answer = await api("GET", "/v1/workers");
    denied.hidden = true;
    const list = answer.workers || [];
    clear($("w-workers")).append(...list.map((w) => card(w, memory)));
    $("w-note").textContent = list.length ? `${list.length} worker(s) connected` : "no worker is connected";
  } catch (error) {
    clear($("w-workers")); // a key that cannot list workers sees none, and no drain
    $("w-note").textContent = "";
    denied.hidden = false;
    denied.textContent =
      error.status === 403
        ? `The workers list and drain need an admin key (${error.code}: ${error.message}).`
        : `Listing workers: ${error}`;
  }
  const served = models.filter((m) => m.serving_workers > 0).length;
  $("w-catalog-summary").textContent = `Model catalog: ${models.length} models, ${served} served by a connected worker`;
  clear($("w-models").tBodies[0]).append(...models.sort(byServed).map(modelRow));
}

async function drainWorker(id) {
  if (!confirm(`Drain ${id}? It finishes its jobs and takes no new ones.`)) return;
  try {
    await api("POST", `/v1/workers/${encodeURIComponent(id)}/drain`);
    ok("workers", "drain");
    note("workers", `Draining ${id}`);
  } catch (error) {
    fail("workers", `Draining ${id}: ${error}`, "drain");
  }
  await load();
}

export function init() {
  $("w-refresh").addEventListener("click", () => load());
}

export function show() {
  load();
  clearInterval(timer);
  // Heartbeats, busy slots and job counts change: refresh while the tab is on screen.
  timer = setInterval(() => ($("tab-workers").hidden ? clearInterval(timer) : load()), 3000);
}
