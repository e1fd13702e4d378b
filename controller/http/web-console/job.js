// The job beside the form: where it stands now (waiting and why, loading the model, step n/N,
// previews), its results, its parameters (run again, copy as a command), timings and report.
import { api, fetchBlob, recall, roleOf, watchJob } from "./api.js";
import { BUILDERS } from "./commands.js";
import { $, between, bytes, clear, duration, el, fail, note, num, ok, short } from "./dom.js";
import { runAgain } from "./generate.js";

const TERMINAL = ["JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED"];
const STAGE_WORDS = { load: "loading model (cold)", decode: "decoding", export: "encoding the outputs", encode: "encoding the prompt" };
let shown = ""; // the job on screen
let job = null; // its last known state
let watch = null; // AbortController of its event stream
let poll = null;
let urls = []; // object URLs of the results on screen, freed when another job is shown
let stages = new Map(); // name -> {name, start, duration, open}
let firstStageAt = NaN;
let openStage = "";
let rendered = ""; // the job whose results are on screen (rendered once: event or final read)

/** Where the job stands, in words: what a user watching it wants to know now. */
function stageText() {
  if (!job) return "";
  const state = job.state;
  if (state === "JOB_STATE_QUEUED") {
    const ahead = job.queue_position ? `${job.queue_position} ahead` : "none ahead";
    return `waiting: ${job.waiting_reason || "in the queue"} · ${ahead}`;
  }
  if (state === "JOB_STATE_RUNNING") {
    const p = job.progress || {};
    const steps = p.total_steps ? `step ${p.step}/${p.total_steps}` : "";
    if (openStage === "denoise") return steps || "denoising";
    if (openStage) return STAGE_WORDS[openStage] || openStage;
    return p.step ? steps : `starting on ${job.worker_id || "a worker"}`;
  }
  if (state === "JOB_STATE_SUCCEEDED") {
    const report = (job.result && job.result.report) || {};
    const run = between(job.started_at, job.finished_at);
    const parts = [`done in ${duration(run)}`];
    if (report.cold_start) parts.push("cold start");
    return parts.join(" · ");
  }
  if (state === "JOB_STATE_FAILED") {
    const e = job.error || {};
    return `failed: ${e.code || ""}: ${e.message || ""}${e.field ? ` (${e.field})` : ""}`;
  }
  return short(state, "JOB_STATE_");
}

function renderStage() {
  $("j-stage").textContent = stageText();
  $("j-stage").dataset.state = job ? short(job.state, "JOB_STATE_") : "";
}

function summary() {
  const report = (job.result && job.result.report) || {};
  const waited = job.started_at ? between(job.created_at, job.started_at) : between(job.created_at);
  const ran = job.started_at ? between(job.started_at, job.finished_at) : NaN;
  const rows = [
    ["State", short(job.state, "JOB_STATE_")],
    ["Model", job.model],
    ["Task", short(job.task, "TASK_")],
    ["Worker", job.worker_id || "-"],
    ["Tenant", job.tenant || "-"],
    ["Created", job.created_at ? new Date(job.created_at).toLocaleString() : "-"],
    ["Queue wait", duration(waited) || "-"],
    ["Run time", duration(ran) || "-"],
  ];
  if (job.state === "JOB_STATE_QUEUED") {
    rows.push(["Queue position", job.queue_position ? `${job.queue_position} ahead` : "none ahead"]);
    if (job.waiting_reason) rows.push(["Waiting", job.waiting_reason]);
  }
  if (report.device) rows.push(["Device", `${report.device}${report.dtype ? ` · ${report.dtype}` : ""}`]);
  if (job.result) rows.push(["Cold start", report.cold_start ? "yes (the model was loaded for this job)" : "no (warm)"]);
  if (Number(report.peak_memory_bytes)) rows.push(["Peak memory", bytes(report.peak_memory_bytes)]);
  if (Number(report.batch_size) > 1) rows.push(["Batch", `${report.batch_size} jobs in one call`]);
  if (job.attempts > 1) rows.push(["Attempts", num(job.attempts)]);
  if (job.error && job.error.code) {
    rows.push(["Error", `${job.error.code}: ${job.error.message}${job.error.field ? ` (${job.error.field})` : ""}`]);
  }
  $("j-summary").replaceChildren(...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { field: k } }, v)]));
  $("j-state").textContent = short(job.state, "JOB_STATE_");
  $("j-state").dataset.state = short(job.state, "JOB_STATE_");
  $("j-cancel").hidden = TERMINAL.includes(job.state);
  $("j-progress").closest(".progress").hidden = job.state === "JOB_STATE_QUEUED"; // no steps yet
}

// ---- parameters: what was asked (the request this tab sent), and what it resolved to -------

const LABELS = [
  ["model", "Model"],
  ["task", "Task"],
  ["prompt", "Prompt"],
  ["negative_prompt", "Negative prompt"],
  ["preset", "Preset"],
  ["width", "Width"],
  ["height", "Height"],
  ["num_inference_steps", "Steps"],
  ["guidance_scale", "Guidance"],
  ["seed", "Seed"],
  ["num_frames", "Frames"],
  ["fps", "FPS"],
  ["duration_ms", "Duration (ms)"],
  ["strength", "Strength"],
  ["scheduler", "Scheduler"],
  ["num_outputs", "Outputs"],
];

function parameters() {
  const kept = recall(shown);
  const request = kept ? kept.request : { model: job.model, task: job.task };
  const report = (job.result && job.result.report) || {};
  const resolved = report.config_resolved || {};
  const seeds = report.seeds || [];
  const rows = [];
  for (const [field, label] of LABELS) {
    let value = request[field];
    let how = "";
    if (value === undefined || value === "") {
      value = field === "seed" ? seeds[0] : resolved[field];
      how = !kept ? "as run" : field === "seed" ? "random" : "default";
    }
    if (value === undefined || value === "" || value === null) continue;
    if (field === "task") value = short(value, "TASK_");
    const shownValue = typeof value === "number" || /^-?\d+(\.\d+)?$/.test(String(value)) ? num(value) : String(value);
    rows.push(el("tr", { dataset: { param: field } }, el("th", {}, label), el("td", {}, shownValue, how ? el("span", { className: "muted" }, ` (${how})`) : "")));
  }
  for (const input of request.inputs || []) {
    rows.push(el("tr", { dataset: { param: roleOf(input.role) } }, el("th", {}, roleOf(input.role)), el("td", {}, input.file_name || input.mime_type || "inline")));
  }
  if (kept) {
    const preview = Boolean(request.extra && request.extra.runtime && request.extra.runtime.preview);
    rows.push(el("tr", { dataset: { param: "previews" } }, el("th", {}, "Live previews"), el("td", {}, preview ? "on" : "off")));
  }
  clear($("j-params").tBodies[0]).append(...rows);
  $("j-request-note").hidden = Boolean(kept);
  $("j-request-note").textContent = kept
    ? ""
    : "This job was not submitted from this tab, and the jobs API does not return a job's request (its prompt): run again and copy need the request, so they are off. The values below come from its run report.";
  for (const button of [$("j-again"), ...document.querySelectorAll("[data-copy]")]) button.disabled = !kept;
}

// ---- live events ---------------------------------------------------------------------------

function progress(p) {
  if (!p || !p.total_steps) return;
  job.progress = p;
  $("j-progress").max = p.total_steps;
  $("j-progress").value = p.step;
  $("j-step").textContent = `step ${p.step} / ${p.total_steps}${p.stage ? ` (${p.stage})` : ""}`;
  renderStage();
}

function preview(p) {
  $("j-preview").src = `data:${p.mime_type};base64,${p.data}`;
  $("j-preview-caption").textContent = `preview at step ${p.step}`;
  $("j-preview-box").hidden = false;
}

function timings(rows) {
  const body = clear($("j-timings").tBodies[0]);
  $("j-timings").hidden = $("j-timings-title").hidden = !rows.length;
  for (const t of rows) {
    const start = t.start_offset_ms === undefined ? "" : duration(t.start_offset_ms);
    const took = t.open ? "running…" : duration(t.duration_ms);
    body.append(el("tr", { dataset: { stage: t.name } }, el("td", {}, t.name === "load" ? "load (cold start)" : t.name), el("td", {}, start), el("td", {}, took)));
  }
}

function stage(s, time) {
  const at = Date.parse(time);
  if (Number.isNaN(firstStageAt)) firstStageAt = at;
  const start = Number.isFinite(at) ? at - firstStageAt : undefined;
  if (s.finished) {
    const known = stages.get(s.name) || {};
    stages.set(s.name, { name: s.name, start_offset_ms: known.start_offset_ms, duration_ms: s.duration_ms });
    if (openStage === s.name) openStage = "";
  } else {
    stages.set(s.name, { name: s.name, start_offset_ms: start, open: true });
    openStage = s.name;
  }
  timings([...stages.values()]);
  renderStage();
}

async function artifactBlob(a) {
  if (a.data) {
    const raw = Uint8Array.from(atob(a.data), (c) => c.charCodeAt(0));
    return new Blob([raw], { type: a.mime_type });
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
    const size = a.width ? `${a.width}x${a.height} · ` : "";
    box.append(
      el(
        "figure",
        { className: "artifact" },
        player,
        el("figcaption", {}, `${size}${bytes(a.size_bytes)} `, el("a", { href: url, download: name }, "Download")),
      ),
    );
  }
  const report = result.report || {};
  if (report.timings) timings(report.timings);
  $("j-report").textContent = JSON.stringify(report, null, 2);
  $("j-report-box").hidden = false;
}

async function refresh(id) {
  const answer = await api("GET", `/v1/jobs/${encodeURIComponent(id)}`);
  if (id !== shown) return null;
  job = answer.job;
  summary();
  parameters();
  if (job.progress) progress(job.progress);
  renderStage();
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
  firstStageAt = NaN;
  openStage = "";
  rendered = "";
  shown = id;
  job = null;
  clear($("j-summary"));
  clear($("j-results"));
  clear($("j-params").tBodies[0]);
  timings([]);
  $("j-report").textContent = "";
  $("j-report-box").hidden = true;
  $("j-progress").value = 0;
  $("j-step").textContent = "";
  $("j-stage").textContent = "";
  $("j-state").textContent = "";
  $("j-state").dataset.state = "";
  $("j-command").hidden = true;
  $("j-preview-box").hidden = true;
  $("j-cancel").hidden = true;
  $("j-empty").hidden = Boolean(id);
  $("j-body").hidden = !id;
  if (!id) return;
  $("j-link").textContent = id;
  $("j-link").href = `#job/${encodeURIComponent(id)}`;
  try {
    await refresh(id);
    ok("generate", "job");
  } catch (error) {
    fail("generate", `Job ${id}: ${error}`, "job");
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
    else if (kind === "stage") stage(event.stage, event.time);
    else if (kind === "state_change") refresh(id).catch(() => {});
    else if (kind === "result") results(event.result);
    else if (kind === "error") fail("generate", `Watching ${id}: ${event.error.code}: ${event.error.message}`, "job");
  };
  try {
    await watchJob(id, onEvent, controller.signal);
  } catch (error) {
    if (error.name !== "AbortError") fail("generate", `Watching ${id}: ${error}`, "job");
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
    ok("generate", "cancel");
    await refresh(shown);
  } catch (error) {
    fail("generate", `Cancelling: ${error}`, "cancel");
  }
}

async function copy(kind) {
  const kept = recall(shown);
  if (!kept) return;
  const text = BUILDERS[kind](kept.request);
  $("j-command").textContent = text;
  $("j-command").hidden = false;
  $("j-command").dataset.kind = kind;
  try {
    await navigator.clipboard.writeText(text);
    note("generate", `Copied the ${kind === "cli" ? "omnirtctl" : kind} command.`);
  } catch {
    note("generate", "The browser refused the clipboard: select the command below and copy it.");
  }
}

export function init() {
  $("j-cancel").addEventListener("click", cancel);
  $("j-again").addEventListener("click", () => {
    const kept = recall(shown);
    if (kept) runAgain(kept.request, kept.files);
  });
  document.querySelectorAll("[data-copy]").forEach((b) => b.addEventListener("click", () => copy(b.dataset.copy)));
}

/** Show job `id` beside the form (the last one shown when `id` is empty). */
export function show(id) {
  const target = id || shown;
  if (target === shown && (job || !target)) {
    if (!target) open("");
    return; // on screen already
  }
  open(target);
}
