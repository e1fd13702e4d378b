// Generate: a form built from the model catalog (tasks, defaults, limits), submitted as a job;
// the job's progress and result show beside it (job.js).
import { api, fileBase64, remember } from "./api.js";
import { $, el, fail, ok, short } from "./dom.js";

let models = [];
let loaded = null; // the promise of the first model list
// Which inputs each task takes (MediaRole names).
const ROLES = {
  TASK_IMAGE2IMAGE: ["image"],
  TASK_INPAINT: ["image", "mask"],
  TASK_IMAGE2VIDEO: ["image"],
  TASK_AUDIO2VIDEO: ["image", "audio"],
};
const VIDEO = ["TASK_TEXT2VIDEO", "TASK_IMAGE2VIDEO", "TASK_AUDIO2VIDEO"];
// Request field -> form input.
const FIELDS = {
  width: "g-width",
  height: "g-height",
  num_inference_steps: "g-steps",
  guidance_scale: "g-guidance",
  num_frames: "g-frames",
  duration_ms: "g-duration",
};
const INPUT_OF = { ...FIELDS, model: "g-model", task: "g-task", prompt: "g-prompt", negative_prompt: "g-negative", seed: "g-seed", preset: "g-preset", inputs: "g-image" };

function current() {
  return models.find((m) => m.id === $("g-model").value);
}

function setNumber(id, value, max) {
  const input = $(id);
  input.value = value ? String(value) : "";
  if (max) input.max = String(max);
  else input.removeAttribute("max");
}

function fillTasks() {
  const model = current();
  const tasks = $("g-task");
  tasks.replaceChildren(...(model ? model.tasks : []).map((t) => el("option", { value: t }, short(t, "TASK_"))));
  const presets = model ? model.presets || [] : [];
  $("g-preset").replaceChildren(
    el("option", { value: "" }, "none"),
    ...presets.map((p) => el("option", { value: p.name, title: p.description || "" }, p.name)),
  );
  $("g-preset").closest("label").hidden = !presets.length;
  const served = model && model.serving_workers > 0;
  $("g-unserved").hidden = !model || served;
  if (model && !served) {
    $("g-unserved").textContent = `No connected worker serves ${model.id}: a job waits in the queue until a worker that serves it connects.`;
  }
  if (!model) return;
  const d = model.defaults || {};
  const l = model.limits || {};
  setNumber("g-width", d.width, l.max_width);
  setNumber("g-height", d.height, l.max_height);
  setNumber("g-steps", d.num_inference_steps, l.max_inference_steps);
  setNumber("g-guidance", d.guidance_scale);
  setNumber("g-frames", d.num_frames, l.max_num_frames);
  setNumber("g-duration", d.duration_ms, l.max_duration_ms);
  if (l.max_prompt_chars) $("g-prompt").maxLength = l.max_prompt_chars;
  else $("g-prompt").removeAttribute("maxLength");
  const warm = (model.warm_on || []).map((w) => w.worker_id);
  $("g-model-info").textContent = [
    model.description || model.family || "",
    `${model.serving_workers || 0} worker(s) serve it`,
    warm.length ? `warm on ${warm.join(", ")}` : "",
  ]
    .filter(Boolean)
    .join(" · ");
  // Runtime options per request (previews among them) are for legacy_call models only, and the
  // null family's pipeline takes none (it makes no pictures to preview).
  const box = $("g-previews");
  const previews = model.execution_mode === "legacy_call" && model.family !== "null";
  if (previews && box.disabled) box.checked = box.dataset.wanted !== "false";
  if (!previews && !box.disabled) box.dataset.wanted = String(box.checked);
  box.disabled = !previews;
  if (!previews) box.checked = false;
  box.closest("label").title = previews ? "" : `${model.id} sends no previews`;
  fillInputs();
}

function fillInputs() {
  const task = $("g-task").value;
  const roles = ROLES[task] || [];
  document.querySelectorAll("#generate-form [data-role]").forEach((label) => {
    label.hidden = !roles.includes(label.dataset.role);
  });
  document.querySelectorAll("#generate-form .video-only").forEach((n) => (n.hidden = !VIDEO.includes(task)));
  document.querySelectorAll("#generate-form .audio-only").forEach((n) => (n.hidden = task !== "TASK_TEXT2AUDIO"));
}

/** Models some worker serves first, then by name. */
export function byServed(a, b) {
  return (b.serving_workers || 0) - (a.serving_workers || 0) || a.id.localeCompare(b.id);
}

/** What the picker starts on: a served model that makes pictures (not the null model's dot). */
function preferred(list) {
  const served = list.filter((m) => m.serving_workers > 0);
  const pictures = served.filter((m) => m.tasks.includes("TASK_TEXT2IMAGE"));
  const pick = pictures.find((m) => m.family !== "null") || served.find((m) => m.family !== "null") || served[0] || list[0];
  return pick ? pick.id : "";
}

async function load() {
  let answer;
  try {
    answer = await api("GET", "/v1/omnirt/models");
    ok("generate", "models");
  } catch (error) {
    fail("generate", `Listing models: ${error}`, "models");
    return;
  }
  models = (answer.models || []).filter((m) => !m.streaming).sort(byServed);
  const chosen = $("g-model").value;
  const option = (m) => el("option", { value: m.id }, m.id);
  const served = models.filter((m) => m.serving_workers > 0);
  const unserved = models.filter((m) => !(m.serving_workers > 0));
  $("g-model").replaceChildren(
    el("optgroup", { label: "served" }, served.map(option)),
    el("optgroup", { label: "not served by any connected worker" }, unserved.map(option)),
  );
  $("g-model").value = models.some((m) => m.id === chosen) ? chosen : preferred(models);
  if (chosen !== $("g-model").value || !chosen) fillTasks();
  else $("g-unserved").hidden = (current() || {}).serving_workers > 0; // served-ness may have changed
}

function number(id) {
  const value = $(id).value;
  return value === "" || $(id).closest("[hidden]") ? undefined : Number(value);
}

function markField(field) {
  document.querySelectorAll("#generate-form .invalid").forEach((n) => n.classList.remove("invalid"));
  const id = INPUT_OF[String(field).split(".")[0]];
  if (id && $(id)) {
    $(id).classList.add("invalid");
    $(id).focus();
  }
}

async function submit(event) {
  event.preventDefault();
  markField("");
  const request = {
    model: $("g-model").value,
    task: $("g-task").value,
    prompt: $("g-prompt").value,
  };
  if ($("g-negative").value) request.negative_prompt = $("g-negative").value;
  if ($("g-preset").value) request.preset = $("g-preset").value;
  for (const [field, id] of Object.entries(FIELDS)) {
    const value = number(id);
    if (value !== undefined) request[field] = value;
  }
  const seed = number("g-seed");
  if (seed !== undefined) request.seed = String(seed); // int64: a string in proto3 JSON
  const inputs = [];
  const files = {};
  for (const role of ROLES[request.task] || []) {
    const file = $(`g-${role}`).files[0];
    if (!file) continue;
    files[role] = file;
    inputs.push({ role: `MEDIA_ROLE_${role.toUpperCase()}`, data: await fileBase64(file), mime_type: file.type });
  }
  if (inputs.length) request.inputs = inputs;
  if ($("g-previews").checked && !$("g-previews").disabled) request.extra = { runtime: { preview: true } };
  $("g-submit").disabled = true;
  try {
    const answer = await api("POST", "/v1/jobs", request);
    ok("generate", "submit");
    remember(answer.job.id, request, files);
    location.hash = `job/${encodeURIComponent(answer.job.id)}`;
  } catch (error) {
    fail("generate", `Submitting: ${error}${error.field ? ` (field ${error.field})` : ""}`, "submit");
    if (error.field) markField(error.field);
  } finally {
    $("g-submit").disabled = false;
  }
}

function setFiles(input, file) {
  const list = new DataTransfer();
  if (file) list.items.add(file);
  input.files = list.files;
}

/** Put `request` (as submitted) back into the form, with its input `files` ({role: File}). */
export async function fill(request, files = {}) {
  await (loaded || load());
  if (!models.some((m) => m.id === request.model)) {
    fail("generate", `Model ${request.model} is not in the catalog any more`, "fill");
    return false;
  }
  $("g-model").value = request.model;
  fillTasks();
  if (request.task) $("g-task").value = request.task;
  fillInputs();
  $("g-prompt").value = request.prompt || "";
  $("g-negative").value = request.negative_prompt || "";
  $("g-preset").value = request.preset || "";
  for (const [field, id] of Object.entries(FIELDS)) {
    if (request[field] !== undefined) $(id).value = String(request[field]);
  }
  $("g-seed").value = request.seed === undefined ? "" : String(request.seed);
  if (!$("g-previews").disabled) $("g-previews").checked = Boolean(request.extra && request.extra.runtime && request.extra.runtime.preview);
  for (const role of ["image", "mask", "audio"]) setFiles($(`g-${role}`), files[role]);
  return true;
}

/** "Run again": the form refilled with `request`, then submitted as a new job. */
export async function runAgain(request, files) {
  if (await fill(request, files)) $("generate-form").requestSubmit();
}

export function init() {
  $("g-model").addEventListener("change", fillTasks);
  $("g-task").addEventListener("change", fillInputs);
  $("generate-form").addEventListener("submit", submit);
  $("generate-form").addEventListener("input", (event) => event.target.classList.remove("invalid"));
}

export function show() {
  const pending = load();
  if (!loaded) loaded = pending;
}
