// Job view: state, queue position, progress, live previews, stage timings, the RunReport, results.
import { api, fetchBlob, watchJob } from "./api.js";
import { $, banner, clear, el, short } from "./dom.js";

const TERMINAL = ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"];
let shown = ""; // the job on screen
let watch = null; // AbortController of its event stream
let poll = null;
let urls = []; // object URLs of the results on screen, freed when another job is shown
let stages = new Map();
let rendered = ""; // the job whose results are on screen (rendered once: event or final read)

function summary(job) {
  const rows = [
    ["Job", job.id],
    ["State", short(job.state, "JOB_STATE_")],
    ["Model", job.model],
    ["Task", short(job.task, "TASK_")],
    ["Worker", job.worker_id || "-"],
    ["Tenant", job.tenant || "-"],
  ];
  if (job.state === "JOB_STATE_QUEUED") {
    rows.push(["Queue position", job.queue_position ? String(job.queue_position) : "-"]);
    if (job.waiting_reason) rows.push(["Waiting", job.waiting_reason]);
  }
  if (job.error && job.error.code) {
    rows.push(["Error", `${job.error.code}: ${job.error.message}${job.error.field ? ` (${job.error.field})` : ""}`]);
  }
  $("j-summary").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { field: k } }, v)]));
  $("j-cancel").hidden = TERMINAL.includes(job.state);
}

function progress(p) {
  if (!p || !p.total_steps) return;
  $("j-progress").max = p.total_steps;
  $("j-progress").value = p.step;
  $("j-step").textContent = `step ${p.step} / ${p.total_steps}${p.stage ? ` (${p.stage})` : ""}`;
}

function preview(p) {
  $("j-preview").src = `data:${p.mime_type};base64,${p.data}`;
  $("j-preview-caption").textContent = `preview at step ${p.step}`;
  $("j-preview-box").hidden = false;
}

function timings(rows) {
  const body = clear($("j-timings").tBodies[0]);
  for (const t of rows) {
    const start = t.start_offset_ms === undefined ? "" : Number(t.start_offset_ms).toFixed(1);
    body.append(el("tr", {}, el("td", {}, t.name), el("td", {}, start), el("td", {}, Number(t.duration_ms).toFixed(1))));
  }
}

function stage(s) {
  if (!s.finished) return;
  stages.set(s.name, { name: s.name, duration_ms: s.duration_ms });
  timings([...stages.values()]);
}

async function artifactBlob(a) {
  if (a.data) {
    const bytes = Uint8Array.from(atob(a.data), (c) => c.charCodeAt(0));
    return new Blob([bytes], { type: a.mime_type });
  }
  return fetchBlob(a.uri);
}

async function results(result) {
  if (rendered === shown) return;
  rendered = shown;
  const box = clear($("j-results"));
  for (const a of result.artifacts || []) {
    let url;
    try {
      url = URL.createObjectURL(await artifactBlob(a));
    } catch (error) {
      box.append(el("p", { className: "error" }, `artifact ${a.index}: ${error}`));
      continue;
    }
    urls.push(url);
    const kind = a.mime_type.split("/")[0];
    const name = a.file_name || `artifact-${a.index}`;
    let player;
    if (kind === "video") player = el("video", { src: url, controls: true, loop: true });
    else if (kind === "audio") player = el("audio", { src: url, controls: true });
    else player = el("img", { src: url, alt: name, className: "result" });
    const size = a.width ? `${a.width}x${a.height}` : "";
    box.append(
      el(
        "figure",
        { className: "artifact" },
        player,
        el("figcaption", {}, `${name} · ${a.mime_type} ${size} · ${a.size_bytes} bytes `, el("a", { href: url, download: name }, "Download")),
      ),
    );
  }
  const report = result.report || {};
  if (report.timings) timings(report.timings);
  $("j-report").textContent = JSON.stringify(report, null, 2);
}

async function refresh(id) {
  const { job } = await api("GET", `/v1/jobs/${encodeURIComponent(id)}`);
  if (id !== shown) return null;
  summary(job);
  if (job.progress) progress(job.progress);
  return job;
}

function stop() {
  if (watch) watch.abort();
  clearInterval(poll);
  watch = null;
  poll = null;
}

async function open(id) {
  stop();
  for (const url of urls) URL.revokeObjectURL(url);
  urls = [];
  stages = new Map();
  rendered = "";
  shown = id;
  clear($("j-summary"));
  clear($("j-results"));
  clear($("j-timings").tBodies[0]);
  $("j-report").textContent = "";
  $("j-progress").value = 0;
  $("j-step").textContent = "";
  $("j-preview-box").hidden = true;
  $("j-cancel").hidden = true;
  if (!id) return;
  $("j-id").value = id;
  let job;
  try {
    job = await refresh(id);
  } catch (error) {
    banner(`Job ${id}: ${error}`);
    return;
  }
  if (!job) return;
  // The queue position changes without an event: read it again while the job waits. A finished
  // job's events are replayed too (its progress and last preview), then the stream ends.
  if (!TERMINAL.includes(job.state)) poll = setInterval(() => refresh(id).catch(() => {}), 1000);
  const controller = new AbortController();
  watch = controller;
  const onEvent = (kind, event) => {
    if (id !== shown) return;
    if (kind === "progress") progress(event.progress);
    else if (kind === "preview") preview(event.preview);
    else if (kind === "stage") stage(event.stage);
    else if (kind === "state_change") refresh(id).catch(() => {});
    else if (kind === "result") results(event.result);
    else if (kind === "error") banner(`Watching ${id}: ${event.error.code}: ${event.error.message}`);
  };
  try {
    await watchJob(id, onEvent, controller.signal);
  } catch (error) {
    if (error.name !== "AbortError") banner(`Watching ${id}: ${error}`);
  }
  if (id === shown) {
    clearInterval(poll);
    poll = null;
    const final = await refresh(id).catch(() => null);
    if (final && final.result && (final.result.artifacts || []).length) await results(final.result);
  }
}

async function cancel() {
  try {
    await api("DELETE", `/v1/jobs/${encodeURIComponent(shown)}`);
    await refresh(shown);
  } catch (error) {
    banner(`Cancelling: ${error}`);
  }
}

export function init() {
  $("job-open").addEventListener("submit", (event) => {
    event.preventDefault();
    location.hash = `job/${encodeURIComponent($("j-id").value.trim())}`;
  });
  $("j-cancel").addEventListener("click", cancel);
}

export function show(id) {
  const target = id || shown;
  if (target && target === shown && $("j-summary").childElementCount) return; // on screen already
  open(target);
}
