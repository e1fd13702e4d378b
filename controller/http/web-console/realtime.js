// Realtime: a talking-head session from the microphone over WS /v1/avatar/realtime.
// Microphone -> AudioWorklet -> resampled to the session's rate -> s16le in b"AUDI" frames;
// b"VIDX" frames back (uint32 count, then uint32 length + JPEG each, little-endian) on an <img>.
import { api, fileBase64, socketProtocols } from "./api.js";
import { $, el, fail, ok } from "./dom.js";

const AUDIO_MAGIC = [0x41, 0x55, 0x44, 0x49]; // "AUDI"
const VIDEO_MAGIC = "VIDX";
let session = null;

function status(text) {
  $("r-status").textContent = text;
}

async function load() {
  try {
    const answer = await api("GET", "/v1/omnirt/models");
    const streaming = (answer.models || []).filter((m) => m.streaming);
    const chosen = $("r-model").value;
    $("r-model").replaceChildren(...streaming.map((m) => el("option", { value: m.id }, m.id)));
    if (streaming.some((m) => m.id === chosen)) $("r-model").value = chosen;
    if (!streaming.length) status("no streaming model in the catalog");
    ok("realtime", "models");
  } catch (error) {
    fail("realtime", `Listing models: ${error}`, "models");
  }
}

/** Linear resampling from `from` Hz to `to` Hz, carrying the position across calls. */
class Resampler {
  constructor(from, to) {
    this.step = from / to;
    this.position = 0;
    this.last = 0;
  }
  push(input) {
    const out = [];
    let pos = this.position;
    while (pos < input.length) {
      const i = Math.floor(pos);
      const frac = pos - i;
      const a = i === 0 ? this.last : input[i - 1];
      const b = input[i];
      out.push(a + (b - a) * frac);
      pos += this.step;
    }
    this.position = pos - input.length;
    this.last = input[input.length - 1];
    return out;
  }
}

class Session {
  constructor(model, image) {
    this.frames = 0;
    this.chunks = 0;
    this.sentBytes = 0;
    this.pending = [];
    this.url = "";
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    this.ws = new WebSocket(`${scheme}//${location.host}/v1/avatar/realtime`, socketProtocols());
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => {
      status("opening the session...");
      this.ws.send(JSON.stringify({ type: "session.create", model, inputs: { image_b64: image } }));
    };
    this.ws.onmessage = (message) => this.receive(message.data);
    this.ws.onclose = (event) => this.closed(event);
    this.ws.onerror = () => status("the WebSocket failed (see the console's log)");
  }

  receive(data) {
    if (typeof data !== "string") {
      this.video(new DataView(data));
      return;
    }
    const message = JSON.parse(data);
    if (message.type === "session.created") {
      this.created = message;
      status(`session ${message.session_id}: listening`);
      ok("realtime", "start");
      this.microphone(message.audio).catch((error) => {
        fail("realtime", `Microphone: ${error}`, "start");
        this.stop();
      });
    } else if (message.type === "metrics") {
      this.chunks += 1;
    } else if (message.type === "error") {
      fail("realtime", `Realtime: ${message.code}: ${message.message}${message.field ? ` (${message.field})` : ""}`);
    } else if (message.type === "session.closed") {
      status(`session closed: ${message.reason || "done"}`);
    }
  }

  video(view) {
    const magic = String.fromCharCode(...new Uint8Array(view.buffer, 0, 4));
    if (magic !== VIDEO_MAGIC) return;
    const count = view.getUint32(4, true);
    let offset = 8;
    let last = null;
    for (let i = 0; i < count; i++) {
      const length = view.getUint32(offset, true);
      last = new Uint8Array(view.buffer, offset + 4, length);
      offset += 4 + length;
    }
    this.frames += count;
    if (last) {
      if (this.url) URL.revokeObjectURL(this.url);
      this.url = URL.createObjectURL(new Blob([last], { type: "image/jpeg" }));
      $("r-video").src = this.url;
      $("r-video").hidden = false; // no empty <img> (a broken image) before the first frame
      $("r-placeholder").hidden = true;
    }
    $("r-counts").textContent = `${this.frames} frames in ${this.chunks} chunks · ${this.sentBytes} audio bytes sent`;
    $("r-counts").dataset.frames = String(this.frames);
  }

  async microphone(audio) {
    const rate = (audio && audio.sample_rate) || 16000;
    this.chunkSamples = (audio && audio.chunk_samples) || rate / 10;
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
    this.context = new AudioContext();
    await this.context.audioWorklet.addModule("/console/pcm-worklet.js");
    const source = this.context.createMediaStreamSource(this.stream);
    const node = new AudioWorkletNode(this.context, "pcm-capture");
    const resampler = new Resampler(this.context.sampleRate, rate);
    node.port.onmessage = (event) => this.audio(resampler.push(event.data));
    source.connect(node);
    node.connect(this.context.destination); // pulled by the graph; the node outputs silence
    await this.context.resume();
    status(`session ${this.created.session_id}: streaming the microphone at ${rate} Hz`);
  }

  audio(samples) {
    this.pending.push(...samples);
    while (this.pending.length >= this.chunkSamples && this.ws.readyState === WebSocket.OPEN) {
      const chunk = this.pending.splice(0, this.chunkSamples);
      const frame = new DataView(new ArrayBuffer(4 + chunk.length * 2));
      AUDIO_MAGIC.forEach((b, i) => frame.setUint8(i, b));
      chunk.forEach((s, i) => frame.setInt16(4 + i * 2, Math.max(-1, Math.min(1, s)) * 0x7fff, true));
      this.ws.send(frame.buffer);
      this.sentBytes += chunk.length * 2;
    }
  }

  stop() {
    if (this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify({ type: "session.close" }));
    this.release();
  }

  release() {
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    if (this.context) this.context.close().catch(() => {});
    this.stream = null;
    this.context = null;
  }

  closed(event) {
    this.release();
    if (event.code !== 1000) status(`closed (${event.code} ${event.reason || ""})`);
    $("r-start").disabled = false;
    $("r-stop").disabled = true;
    if (session === this) session = null;
  }
}

async function start() {
  const file = $("r-portrait").files[0];
  if (!file) {
    fail("realtime", "Choose a portrait image first.", "start");
    return;
  }
  if (!$("r-model").value) {
    fail("realtime", "No streaming model to open a session on.", "start");
    return;
  }
  $("r-start").disabled = true;
  $("r-stop").disabled = false;
  session = new Session($("r-model").value, await fileBase64(file));
}

export function init() {
  $("r-start").addEventListener("click", () => start().catch((error) => fail("realtime", `Realtime: ${error}`, "start")));
  $("r-stop").addEventListener("click", () => session && session.stop());
}

export function show() {
  load();
}
