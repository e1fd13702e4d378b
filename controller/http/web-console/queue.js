// Queue and history: the caller's jobs (an admin's: everyone's), newest first. Waiting jobs say
// why and how many are ahead; finished ones show a thumbnail, their queue wait and run time.
import { api, fetchBlob, recall } from "./api.js";
import { $, between, duration, el, fail, note, ok, short } from "./dom.js";
import { byServed } from "./generate.js";

const ACTIVE = ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING"];
const PAGE = 50;
const FRESH = 20; // queued jobs read one by one for their position (the list's may be stale)
let timer = null;
const thumbs = new Map(); // job id -> object URL of its first image (when not inline)

function thumbnail(job) {
  const a = ((job.result && job.result.artifacts) || [])[0];
  if (!a) return "";
  const kind = a.mime_type.split("/")[0];
  if (kind === "video" && a.data) {
    // The first frame, as a still (no controls, never played).
    const still = el("video", { className: "thumb", muted: true, preload: "metadata", src: `data:${a.mime_type};base64,${a.data}` });
    return el("a", { href: `#job/${encodeURIComponent(job.id)}`, title: "video" }, still);
  }
  if (kind !== "image") return el("span", { className: "thumb kind" }, kind);
  const img = el("img", { className: "thumb", alt: a.file_name || "output" });
  if (a.data) img.src = `data:${a.mime_type};base64,${a.data}`;
  else if (thumbs.has(job.id)) img.src = thumbs.get(job.id);
  else {
    fetchBlob(a.uri)
      .then((blob) => {
        thumbs.set(job.id, URL.createObjectURL(blob));
        img.src = thumbs.get(job.id);
      })
      .catch(() => img.remove());
  }
  return el("a", { href: `#job/${encodeURIComponent(job.id)}` }, img);
}

function where(job) {
  if (job.state === "JOB_STATE_QUEUED") {
    const ahead = job.queue_position ? `${job.queue_position} ahead` : "none ahead";
    return [el("span", { className: "ahead" }, ahead), el("div", { className: "muted reason" }, job.waiting_reason || "")];
  }
  const p = job.progress || {};
  if (job.state === "JOB_STATE_RUNNING") return `${job.worker_id} · ${p.total_steps ? `step ${p.step}/${p.total_steps}` : "starting"}`;
  if (job.state === "JOB_STATE_FAILED" && job.error) return el("span", { className: "muted" }, `${job.error.code}: ${job.error.message}`);
  if (job.state === "JOB_STATE_CANCELLED" && job.error) return el("span", { className: "muted" }, job.error.message);
  return job.worker_id || "";
}

/** What a row shows of a job, but the waiting time (updated in place). */
function signature(job) {
  const p = job.progress || {};
  const error = job.error ? job.error.message : "";
  return JSON.stringify([job.state, job.queue_position, job.waiting_reason, p.step, job.worker_id, job.started_at, job.finished_at, error]);
}

function row(job) {
  const state = short(job.state, "JOB_STATE_");
  const link = el("a", { href: `#job/${encodeURIComponent(job.id)}`, className: "mono" }, job.id);
  const kept = recall(job.id);
  const prompt = kept && kept.request.prompt ? el("div", { className: "muted prompt", title: kept.request.prompt }, kept.request.prompt) : "";
  const waited = job.started_at ? between(job.created_at, job.started_at) : job.state === "JOB_STATE_QUEUED" ? between(job.created_at) : NaN;
  const ran = job.started_at ? between(job.started_at, job.finished_at) : NaN;
  const cancel = ACTIVE.includes(job.state)
    ? el("button", { type: "button", className: "cancel", onclick: () => cancelJob(job.id) }, "Cancel")
    : "";
  return el(
    "tr",
    { dataset: { job: job.id, state } },
    el("td", { className: "thumb-cell" }, thumbnail(job)),
    el("td", {}, link, prompt),
    el("td", {}, el("span", { className: "badge", dataset: { state } }, state === "queued" ? "waiting" : state)),
    el("td", {}, job.model),
    el("td", { className: "where" }, where(job)),
    el("td", { className: "wait" }, duration(waited)),
    el("td", { className: "run" }, duration(ran)),
    el("td", { className: "created" }, job.created_at ? new Date(job.created_at).toLocaleTimeString() : ""),
    el("td", {}, cancel),
  );
}

async function fillModels() {
  try {
    const answer = await api("GET", "/v1/omnirt/models");
    const chosen = $("q-model").value;
    const ids = (answer.models || []).filter((m) => !m.streaming).sort(byServed).map((m) => m.id);
    $("q-model").replaceChildren(el("option", { value: "" }, "all models"), ...ids.map((id) => el("option", { value: id }, id)));
    $("q-model").value = chosen;
  } catch {
    // the job list says what is wrong with the key; the filter keeps "all models"
  }
}

async function load() {
  const state = $("q-state").value;
  const states = state === "active" ? ACTIVE : state ? [state] : [];
  const query = new URLSearchParams({ page_size: String(PAGE) });
  for (const s of states) query.append("states", s);
  if ($("q-model").value) query.set("model", $("q-model").value);
  let answer;
  try {
    answer = await api("GET", `/v1/jobs?${query}`);
    ok("queue", "list");
  } catch (error) {
    fail("queue", `Listing jobs: ${error}`, "list");
    return;
  }
  const jobs = answer.jobs || [];
  // A listed job's position is as of its last read: read the waiting ones again.
  const waiting = jobs.filter((j) => j.state === "JOB_STATE_QUEUED").slice(0, FRESH);
  await Promise.all(
    waiting.map((j) =>
      api("GET", `/v1/jobs/${encodeURIComponent(j.id)}`)
        .then((a) => Object.assign(j, a.job))
        .catch(() => {}),
    ),
  );
  // Rows that did not change stay the same nodes: a click in progress, a thumbnail, a
  // selection survive the refresh.
  const kept = new Map();
  for (const tr of $("q-jobs").tBodies[0].rows) kept.set(tr.dataset.job, tr);
  const rows = jobs.map((job) => {
    const sig = signature(job);
    const old = kept.get(job.id);
    if (!old || old.dataset.sig !== sig) {
      const fresh = row(job);
      fresh.dataset.sig = sig;
      return fresh;
    }
    if (job.state === "JOB_STATE_QUEUED") old.querySelector("td.wait").textContent = duration(between(job.created_at));
    return old;
  });
  $("q-jobs").tBodies[0].replaceChildren(...rows);
  $("q-empty").hidden = jobs.length > 0;
  const counts = {};
  for (const j of jobs) counts[short(j.state, "JOB_STATE_")] = (counts[short(j.state, "JOB_STATE_")] || 0) + 1;
  $("q-count").textContent =
    `${jobs.length}${answer.next_page_token ? "+" : ""} job(s)` +
    (Object.keys(counts).length ? `: ${Object.entries(counts).map(([k, v]) => `${v} ${k === "queued" ? "waiting" : k}`).join(", ")}` : "");
}

async function cancelJob(id) {
  try {
    const answer = await api("DELETE", `/v1/jobs/${encodeURIComponent(id)}`);
    ok("queue", "cancel");
    note("queue", answer.cancelled ? `Cancelled ${id}` : `${id} had already finished`);
  } catch (error) {
    fail("queue", `Cancelling ${id}: ${error}`, "cancel");
  }
  await load();
}

export function init() {
  $("q-refresh").addEventListener("click", load);
  $("q-state").addEventListener("change", load);
  $("q-model").addEventListener("change", load);
}

export function show() {
  fillModels();
  load();
  clearInterval(timer);
  // Refresh while the tab is on screen.
  timer = setInterval(() => ($("tab-queue").hidden ? clearInterval(timer) : load()), 2000);
}
