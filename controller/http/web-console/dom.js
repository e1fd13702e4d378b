// Building DOM nodes from API data: text always goes in as text, never as HTML. Also the
// formatting every view shares, and each tab's own alert.

/** el("td", {className: "x"}, "text", node): an element with properties and children. */
export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "dataset") Object.assign(node.dataset, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node[name] = value;
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function clear(node) {
  node.replaceChildren();
  return node;
}

export function $(id) {
  return document.getElementById(id);
}

/** "JOB_STATE_RUNNING" -> "running", "TASK_TEXT2IMAGE" -> "text2image". */
export function short(name, prefix) {
  return String(name || "").replace(prefix, "").toLowerCase();
}

/**
 * A number as people write it: integers without a fraction (a protobuf Struct carries every
 * number as a double, so 64 arrives as 64.0 from some clients), others to 6 significant digits
 * (a float32 0.8 arrives as 0.800000011920929). Strings of digits (int64 in proto3 JSON) stay.
 */
export function num(value) {
  if (typeof value === "string" && /^-?\d+$/.test(value)) return value;
  const n = Number(value);
  if (value === "" || value === null || value === undefined || !Number.isFinite(n)) return String(value ?? "");
  return Number.isInteger(n) ? String(n) : String(Number(n.toPrecision(6)));
}

/** Milliseconds as "850 ms", "2.4 s", "3 min 5 s". */
export function duration(ms) {
  const n = Number(ms);
  if (!Number.isFinite(n) || n < 0) return "";
  if (n < 1000) return `${n < 10 ? num(n.toFixed(1)) : Math.round(n)} ms`;
  if (n < 60_000) return `${(n / 1000).toFixed(1)} s`;
  const s = Math.round(n / 1000);
  return s < 3600 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** Bytes as "4.2 MiB". */
export function bytes(value) {
  let n = Number(value);
  if (!Number.isFinite(n) || n <= 0) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

/** Milliseconds between two timestamps (the second defaults to now); NaN when one is missing. */
export function between(from, to) {
  if (!from) return NaN;
  return (to ? Date.parse(to) : Date.now()) - Date.parse(from);
}

/** "12 s ago" for a timestamp. */
export function ago(time) {
  const ms = between(time);
  return Number.isFinite(ms) ? `${duration(Math.max(ms, 0))} ago` : "";
}

// ---- each tab's alert: an error stays until dismissed, or until a later success of the same
// kind in that tab (listing again clears a listing error, not a failed cancel); a note fades.

const timers = {};

function box(tab) {
  return document.querySelector(`[data-alert="${tab}"]`);
}

/** Show `message` in `tab`'s alert; `topic` names what failed, for `ok`. */
export function fail(tab, message, topic = "") {
  show(tab, String(message), "error", topic);
}

/** A note (not an error) in `tab`'s alert, gone after a few seconds. */
export function note(tab, message) {
  show(tab, String(message), "notice", "");
  timers[tab] = setTimeout(() => dismiss(tab), 6000);
}

function show(tab, message, kind, topic) {
  const node = box(tab);
  clearTimeout(timers[tab]);
  node.querySelector(".text").textContent = message;
  node.className = `alert ${kind}`;
  node.dataset.topic = topic;
  node.hidden = false;
}

/** `topic` went well in `tab`: its error, if one is shown, is over. */
export function ok(tab, topic = "") {
  const node = box(tab);
  if (!node.hidden && node.classList.contains("error") && node.dataset.topic === topic) dismiss(tab);
}

export function dismiss(tab) {
  clearTimeout(timers[tab]);
  box(tab).hidden = true;
}

/** Hide every tab's alert (a new key: the last key's errors are not this one's). */
export function dismissAll() {
  document.querySelectorAll("[data-alert]").forEach((node) => dismiss(node.dataset.alert));
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("[data-alert] .dismiss");
  if (button) dismiss(button.closest("[data-alert]").dataset.alert);
});
