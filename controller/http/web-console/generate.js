// Generate: a form built from the model catalog (tasks, defaults, limits), submitted as a job.
import { api, fileBase64 } from "./api.js";
import { $, banner, el, short } from "./dom.js";

let models = [];
// Which inputs each task takes (MediaRole names).
const ROLES = {
  TASK_IMAGE2IMAGE: ["image"],
  TASK_INPAINT: ["image", "mask"],
  TASK_IMAGE2VIDEO: ["image"],
  TASK_AUDIO2VIDEO: ["image", "audio"],
};
const VIDEO = ["TASK_TEXT2VIDEO", "TASK_IMAGE2VIDEO", "TASK_AUDIO2VIDEO"];

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
  $("g-model-info").textContent =
    `${model.description || model.family || ""} · ${model.serving_workers} worker(s) serve it` +
    (warm.length ? ` · warm on ${warm.join(", ")}` : "");
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

async function load() {
  try {
    const answer = await api("GET", "/v1/omnirt/models");
    models = (answer.models || []).filter((m) => !m.streaming).sort(byServed);
  } catch (error) {
    banner(`Listing models: ${error}`);
    return;
  }
  const chosen = $("g-model").value;
  $("g-model").replaceChildren(...models.map((m) => el("option", { value: m.id }, m.id)));
  if (models.some((m) => m.id === chosen)) $("g-model").value = chosen;
  fillTasks();
}

function number(id) {
  const value = $(id).value;
  return value === "" || $(id).closest("[hidden]") ? undefined : Number(value);
}

async function submit(event) {
  event.preventDefault();
  const request = {
    model: $("g-model").value,
    task: $("g-task").value,
    prompt: $("g-prompt").value,
  };
  if ($("g-negative").value) request.negative_prompt = $("g-negative").value;
  if ($("g-preset").value) request.preset = $("g-preset").value;
  const fields = {
    width: "g-width",
    height: "g-height",
    num_inference_steps: "g-steps",
    guidance_scale: "g-guidance",
    num_frames: "g-frames",
    duration_ms: "g-duration",
  };
  for (const [field, id] of Object.entries(fields)) {
    const value = number(id);
    if (value !== undefined) request[field] = value;
  }
  const seed = number("g-seed");
  if (seed !== undefined) request.seed = String(seed); // int64: a string in proto3 JSON
  const inputs = [];
  for (const role of ROLES[request.task] || []) {
    const file = $(`g-${role}`).files[0];
    if (file) inputs.push({ role: `MEDIA_ROLE_${role.toUpperCase()}`, data: await fileBase64(file), mime_type: file.type });
  }
  if (inputs.length) request.inputs = inputs;
  if ($("g-previews").checked) request.extra = { runtime: { preview: true } };
  $("g-submit").disabled = true;
  try {
    const answer = await api("POST", "/v1/jobs", request);
    location.hash = `job/${encodeURIComponent(answer.job.id)}`;
  } catch (error) {
    banner(`Submitting: ${error}${error.field ? ` (field ${error.field})` : ""}`);
  } finally {
    $("g-submit").disabled = false;
  }
}

export function init() {
  $("g-model").addEventListener("change", fillTasks);
  $("g-task").addEventListener("change", fillInputs);
  $("generate-form").addEventListener("submit", submit);
}

export function show() {
  load();
}
