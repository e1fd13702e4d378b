// A request as a command to paste elsewhere: curl against this gateway, the Python SDK, omnirtctl.
// Each says the same request the console sent; input files go by their file name (the user has
// them), the API key by $OMNIRT_API_KEY (never the key itself: a clipboard is not a secret store).
import { getKey, roleOf } from "./api.js";
import { short } from "./dom.js";

// Request field -> omnirtctl flag (`omnirtctl generate --help`).
const FLAGS = {
  prompt: "--prompt",
  negative_prompt: "--negative-prompt",
  preset: "--preset",
  width: "--width",
  height: "--height",
  num_inference_steps: "--steps",
  guidance_scale: "--guidance",
  seed: "--seed",
  num_frames: "--num-frames",
  fps: "--fps",
  num_outputs: "--num-outputs",
  strength: "--strength",
  duration_ms: "--duration-ms",
  scheduler: "--scheduler",
  priority: "--priority",
};

/** A word for a POSIX shell: single-quoted unless it is plainly safe. */
export function sh(word) {
  const text = String(word);
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`;
}

function inputs(request) {
  return (request.inputs || []).map((i) => ({ role: roleOf(i.role), name: i.file_name || `${roleOf(i.role)}.bin`, mime: i.mime_type || "" }));
}

/** `curl` POSTing the request to this gateway's /v1/jobs (it answers the queued job). */
export function curl(request) {
  const body = { ...request };
  const files = inputs(request);
  // The inputs' bytes: read from the files at run time, base64 without line breaks.
  const marks = files.map((_, i) => `@@OMNIRT_FILE_${i}@@`);
  if (files.length) body.inputs = files.map((f, i) => ({ role: `MEDIA_ROLE_${f.role.toUpperCase()}`, data: marks[i], mime_type: f.mime }));
  let data = sh(JSON.stringify(body));
  if (!data.startsWith("'")) data = `'${data}'`;
  files.forEach((f, i) => {
    data = data.replace(marks[i], `'"$(base64 < ${sh(f.name)} | tr -d '\\n')"'`);
  });
  const lines = [`curl -sS -X POST ${sh(`${location.origin}/v1/jobs`)}`, "-H 'Content-Type: application/json'"];
  if (getKey()) lines.push(`-H "Authorization: Bearer $OMNIRT_API_KEY"`);
  lines.push(`-d ${data}`);
  return lines.join(" \\\n  ");
}

/** A JSON value as a Python literal. */
function py(value) {
  if (value === null || value === undefined) return "None";
  if (value === true) return "True";
  if (value === false) return "False";
  if (Array.isArray(value)) return `[${value.map(py).join(", ")}]`;
  if (typeof value === "object") return `{${Object.entries(value).map(([k, v]) => `${JSON.stringify(k)}: ${py(v)}`).join(", ")}}`;
  return JSON.stringify(value); // JSON's string escapes are Python's too
}

/** The Python SDK: `omnirt.Client().generate(...)`, saving the outputs. */
export function python(request) {
  const args = [`model=${py(request.model)}`];
  if (request.task) args.push(`task=${py(short(request.task, "TASK_"))}`);
  for (const field of Object.keys(FLAGS)) {
    if (request[field] === undefined || request[field] === "") continue;
    args.push(`${field}=${field === "seed" ? String(request.seed) : py(request[field])}`);
  }
  for (const f of inputs(request)) args.push(`${f.role}=${py(f.name)}`);
  if (request.extra) args.push(`extra=${py(request.extra)}`);
  return [
    "import omnirt",
    "",
    "# The controller's gRPC address comes from $OMNIRT_CONTROLLER (default 127.0.0.1:50051),",
    "# the API key from $OMNIRT_API_KEY.",
    "with omnirt.Client() as client:",
    "    result = client.generate(",
    ...args.map((a) => `        ${a},`),
    "    )",
    'print(result.save("outputs"))',
    "",
  ].join("\n");
}

/** omnirtctl generate (it reads $OMNIRT_CONTROLLER and $OMNIRT_API_KEY), saving into ./outputs. */
export function cli(request) {
  const words = ["omnirtctl", "generate", "--model", sh(request.model)];
  if (request.task) words.push("--task", sh(short(request.task, "TASK_")));
  for (const [field, flag] of Object.entries(FLAGS)) {
    if (request[field] === undefined || request[field] === "") continue;
    words.push(flag, sh(request[field]));
  }
  for (const f of inputs(request)) words.push(`--${f.role}`, sh(f.name));
  if (request.extra) words.push("--extra", sh(JSON.stringify(request.extra)));
  return words.join(" ");
}

export const BUILDERS = { curl, python, cli };
