// Queue: the caller's jobs (an admin's: everyone's) by state, with a cancel button.
import { api } from "./api.js";
import { $, banner, clear, el, short } from "./dom.js";

const ACTIVE = ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING"];
let timer = null;

function row(job) {
  const link = el("a", { href: `#job/${encodeURIComponent(job.id)}` }, job.id);
  const p = job.progress || {};
  const cancel = ACTIVE.includes(job.state)
    ? el("button", { type: "button", className: "cancel", onclick: () => cancelJob(job.id) }, "Cancel")
    : "";
  return el(
    "tr",
    { dataset: { job: job.id, state: short(job.state, "JOB_STATE_") } },
    el("td", {}, link),
    el("td", {}, short(job.state, "JOB_STATE_")),
    el("td", {}, job.model),
    el("td", {}, short(job.task, "TASK_")),
    el("td", {}, job.state === "JOB_STATE_QUEUED" && job.queue_position ? String(job.queue_position) : ""),
    el("td", {}, p.total_steps ? `${p.step}/${p.total_steps}` : ""),
    el("td", {}, job.created_at ? new Date(job.created_at).toLocaleTimeString() : ""),
    el("td", {}, cancel),
  );
}

async function load() {
  const state = $("q-state").value;
  const states = state === "all" ? [] : state ? [state] : ACTIVE;
  const query = new URLSearchParams({ page_size: "100" });
  for (const s of states) query.append("states", s);
  try {
    const answer = await api("GET", `/v1/jobs?${query}`);
    clear($("q-jobs").tBodies[0]).append(...(answer.jobs || []).map(row));
  } catch (error) {
    banner(`Listing jobs: ${error}`);
  }
}

async function cancelJob(id) {
  try {
    const answer = await api("DELETE", `/v1/jobs/${encodeURIComponent(id)}`);
    banner(answer.cancelled ? `Cancelled ${id}` : `${id} had already finished`, false);
  } catch (error) {
    banner(`Cancelling ${id}: ${error}`);
  }
  await load();
}

export function init() {
  $("q-refresh").addEventListener("click", load);
  $("q-state").addEventListener("change", load);
}

export function show() {
  load();
  clearInterval(timer);
  // Refresh while the tab is on screen.
  timer = setInterval(() => ($("tab-queue").hidden ? clearInterval(timer) : load()), 2000);
}
