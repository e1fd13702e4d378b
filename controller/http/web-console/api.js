// Calls to the gateway's API with the tab's key. Every data call goes through here.
const KEY = "omnirt.apiKey";

export class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || `HTTP ${status}`);
    this.status = status;
    this.code = error.code || String(status);
    this.field = error.field || "";
  }
  toString() {
    const hint = this.status === 401 ? " (enter an API key at the top)" : "";
    return `${this.status} ${this.code}: ${this.message}${hint}`;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  // Jobs submitted in the original OmniRT's shape read back in ours here (docs/http.md).
  const base = { ...extra, "X-Omnirt-Shape": "omnirt" };
  const key = getKey();
  return key ? { ...base, Authorization: `Bearer ${key}` } : base;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  return new ApiError(response.status, body);
}

/** A JSON call: the parsed answer, or an ApiError with the gateway's code and message. */
export async function api(method, path, body) {
  const init = { method, headers: headers() };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

/** An artifact's bytes as a Blob (the artifact routes need the key, so no plain <img src>). */
export async function fetchBlob(url) {
  const response = await fetch(url, { headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.blob();
}

/**
 * Server-Sent Events of a job, read with fetch (EventSource cannot send a key).
 * Calls onEvent(kind, data) for each; resolves when the stream ends or `signal` aborts.
 */
export async function watchJob(jobId, onEvent, signal) {
  const response = await fetch(`/v1/jobs/${encodeURIComponent(jobId)}/events`, {
    headers: headers({ Accept: "text/event-stream" }),
    signal,
  });
  if (response.status === 204) return;
  if (!response.ok) throw await failure(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let kind = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
      }
      if (data.length) onEvent(kind, JSON.parse(data.join("\n")));
    }
  }
}

/** The subprotocols that carry the key on a WebSocket (a browser cannot set its headers). */
export function socketProtocols() {
  const key = getKey();
  if (!key) return ["omnirt.v1"];
  const bytes = new TextEncoder().encode(key);
  let binary = "";
  for (const b of bytes) binary += String.fromCharCode(b);
  const encoded = btoa(binary).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  return ["omnirt.v1", `omnirt.bearer.${encoded}`];
}

// ---- the requests this tab submitted: the jobs API does not return a job's request, so the
// console keeps what it sent (in the tab's sessionStorage, without the inputs' bytes; the input
// files themselves only in memory) to show its parameters, run it again and copy it as a command.
const REQUESTS = "omnirt.requests";
const REMEMBERED = 200;
const inputFiles = new Map(); // job id -> {role: File}

function requests() {
  try {
    return JSON.parse(sessionStorage.getItem(REQUESTS) || "{}");
  } catch {
    return {};
  }
}

/** Keep `request` (as submitted) and its input `files` ({role: File}) for job `jobId`. */
export function remember(jobId, request, files = {}) {
  const kept = requests();
  const light = { ...request };
  if (light.inputs) {
    light.inputs = light.inputs.map(({ data, ...rest }) => ({ ...rest, file_name: files[roleOf(rest.role)]?.name || "" }));
  }
  kept[jobId] = light;
  const ids = Object.keys(kept);
  for (const id of ids.slice(0, Math.max(0, ids.length - REMEMBERED))) delete kept[id];
  try {
    sessionStorage.setItem(REQUESTS, JSON.stringify(kept));
  } catch {
    // storage full: the request is not kept, the job runs all the same
  }
  inputFiles.set(jobId, files);
}

/** {request, files} this tab submitted as job `jobId`, or null. */
export function recall(jobId) {
  const request = requests()[jobId];
  return request ? { request, files: inputFiles.get(jobId) || {} } : null;
}

/** "MEDIA_ROLE_IMAGE" -> "image". */
export function roleOf(role) {
  return String(role || "").replace("MEDIA_ROLE_", "").toLowerCase();
}

/** A File as base64 (the JSON API takes media inline as proto3 bytes). */
export function fileBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] || "");
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
