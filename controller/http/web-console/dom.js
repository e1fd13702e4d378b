// Building DOM nodes from API data: text always goes in as text, never as HTML.

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

let bannerTimer = null;

/** Show an error (or a note) at the top of the page. */
export function banner(message, isError = true) {
  const node = $("banner");
  node.textContent = String(message);
  node.className = isError ? "error" : "notice";
  node.hidden = false;
  clearTimeout(bannerTimer);
  bannerTimer = setTimeout(() => (node.hidden = true), 15000);
}
