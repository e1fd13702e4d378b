"""`WS /v1/avatar/realtime`: realtime sessions over the original OmniRT's WebSocket protocol.

Its clients switch by changing the address. Client -> server:

- text `{"type": "session.create", "model": ..., "inputs": {"image_b64": ...}, "config": {...}}`
  first (OmniRT also reads `config.fps|width|height|video_encoding|idle_timeout_ms` into the
  SessionOpen fields and passes the rest as the session's config, but for `config.chunk_samples`,
  which this edge holds against the model's once the session is ready; OmniRT's
  `"progress": true` asks for session.progress);
- binary `b"AUDI" + pcm_s16le` audio;
- text `{"type": "session.cancel"}` (drop the audio not yet animated: an interrupt; the session
  goes on), `{"type": "session.close"}` (finish what was sent, then close), `{"type": "ping"}`,
  and OmniRT's `{"type": "text", "text": ...}` (a session driven by text).

Server -> client: `{"type": "session.created", "session_id", "trace_id", "audio": {format,
sample_rate, channels, chunk_samples}, "video": {encoding "jpeg-seq", wire_magic "VIDX", fps,
width, height}}`; per chunk `{"type": "metrics", "chunk_index", "infer_ms", "encode_ms", ...}`
then binary `b"VIDX" + uint32 frame_count + (uint32 jpeg_len + jpeg)*` (little-endian, as the
original); `{"type": "session.cancelled", "session_id"}` once the interrupt is on its way to the
worker; `{"type": "pong"}`; `{"type": "session.progress", ...}` when asked for; last `{"type":
"session.closed", "session_id", "reason", "report"}` and close 1000. An error is `{"type":
"error", "code", "message", "field"}` then a close: 1008 for bad input, 1013 (try again later)
for RESOURCE_EXHAUSTED / UNAVAILABLE, 1011 for anything else.

The answers to the client's control messages (pong, session.cancelled) are written by the task
reading the socket while the relay writes the worker's output: one lock keeps a chunk's metrics
and its VIDX message together, as the original's clients read them.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import struct
import sys
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import WSMsgType, web
from google.protobuf import json_format

from omnirt import types as t
from omnirt._internal import convert as c
from omnirt._internal.protocol import realtime as wire
from omnirt._internal.protocol.messages import SessionSettings
from omnirt.controller.edges.auth import caller
from omnirt.controller.edges.shutdown import Shutdown
from omnirt.controller.http.security import WS_PROTOCOL
from omnirt.controller.realtime.manager import SessionManager
from omnirt.controller.realtime.relay import relay
from omnirt.errors import InvalidRequest, OmniRTError
from omnirt.v1 import realtime_pb2 as rt

log = logging.getLogger("omnirt.controller.realtime.websocket")

PATH = "/v1/avatar/realtime"
AUDIO_MAGIC, VIDEO_MAGIC = b"AUDI", b"VIDX"
MAX_FRAME_BYTES = 48 << 20  # a session.create with a 32 MiB image in base64
OPEN_FIELDS = ("fps", "width", "height", "video_encoding", "idle_timeout_ms", "sample_rate")
# config keys this edge reads itself (SessionOpen has no field for them): the original's
# clients send the chunk size their model takes; it is checked against SessionReady's.
EDGE_FIELDS = ("chunk_samples",)
CLOSE_BAD_INPUT, CLOSE_TRY_LATER, CLOSE_ERROR = 1008, 1013, 1011


def register(app: web.Application, servicers: Mapping[str, Any], shutdown: Shutdown | None = None) -> None:
    """Add the route; sessions go through the RealtimeService servicer's manager (of `servicers`,
    the gateway's by full service name). When the controller shuts down (`shutdown`), a session
    ends with an UNAVAILABLE error ("controller shutting down, reconnect") and close 1013."""
    servicer = servicers.get(rt.DESCRIPTOR.services_by_name["RealtimeService"].full_name)
    if servicer is None:
        return
    manager: SessionManager = servicer.manager

    async def handle(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=MAX_FRAME_BYTES, protocols=(WS_PROTOCOL,))
        await ws.prepare(request)
        try:
            work = serve(ws, manager, caller().tenant)
            await (work if shutdown is None else shutdown.session(work))
        except OmniRTError as exc:
            await fail(ws, exc)
        except ConnectionResetError:
            pass
        return ws

    app.router.add_get(PATH, handle)


async def fail(ws: web.WebSocketResponse, exc: OmniRTError) -> None:
    code = exc.code.name
    body = {"type": "error", "code": code, "message": exc.message, "field": exc.field}
    close = (
        CLOSE_BAD_INPUT if code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND") else CLOSE_ERROR
    )
    if code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"):
        close = CLOSE_TRY_LATER
    if not ws.closed:
        await ws.send_json(body)
        await ws.close(code=close, message=code.encode())


async def serve(ws: web.WebSocketResponse, manager: SessionManager, tenant: str) -> None:
    first = await ws.receive()
    if first.type is not WSMsgType.TEXT:
        raise InvalidRequest("type: the first message must be a session.create JSON text", field="type")
    message = parse(first.data)
    opened = session_open(message)
    asked, progress = edge_options(message)
    session, ready = await manager.open(opened, tenant=tenant)
    if asked and asked != ready.chunk_samples:
        # Only the worker knows the model's chunk size: the session opened, and ends unused.
        await manager.stop(session, "refused")
        raise InvalidRequest(
            f"config.chunk_samples: {asked} is not the model's {ready.chunk_samples} (leave it "
            "out, or 0, for the model's)",
            field="config.chunk_samples",
        )
    await ws.send_json(created(ready))
    lock = asyncio.Lock()  # see the module docstring
    # The socket closing without session.close is the client gone, not the end of its input.
    feed = inputs(ws, ready.session_id, lock)
    async for response in relay(manager, session, opened, feed, gone=lambda: True):
        async with lock:
            if isinstance(response, wire.OutputChunk):
                await ws.send_json(
                    {
                        "type": "metrics",
                        "chunk_index": response.sequence,
                        "infer_ms": 0,
                        "encode_ms": 0,
                        "pts_ms": response.pts_ms,
                        "latency_ms": round(response.latency_ms, 3),
                        "frame_count": len(response.frames),
                    }
                )
                await ws.send_bytes(video_message(response.frames))
            elif isinstance(response, wire.SessionProgress) and progress:
                body = json_of(wire.progress_to_proto(response))
                await ws.send_json({"type": "session.progress", **body})
            elif isinstance(response, wire.SessionClosed):
                report = json_of(wire.report_to_proto(response.report))
                await ws.send_json(
                    {
                        "type": "session.closed",
                        "session_id": ready.session_id,
                        "reason": response.reason,
                        "report": report,
                    }
                )
                await ws.close(code=1000, message=b"session closed")
                return


async def inputs(
    ws: web.WebSocketResponse, session_id: str, lock: asyncio.Lock
) -> AsyncIterator[wire.SessionInput]:
    """The client's frames as session input; pings and session.cancel are answered here."""
    async for frame in ws:
        if frame.type is WSMsgType.BINARY:
            data: bytes = frame.data
            if data[:4] != AUDIO_MAGIC:
                raise InvalidRequest("audio: a binary message is b'AUDI' + pcm_s16le", field="audio")
            yield wire.AudioChunk(data=data[4:])
        elif frame.type is WSMsgType.TEXT:
            message = parse(frame.data)
            kind = message.get("type")
            if kind == "ping":
                async with lock:
                    await ws.send_json({"type": "pong"})
            elif kind == "session.cancel":
                yield wire.Interrupt()
                # The relay asks for the next input once it has passed this one on: the
                # interrupt is on its way to the worker (output already made still comes).
                async with lock:
                    await ws.send_json({"type": "session.cancelled", "session_id": session_id})
            elif kind == "session.close":
                yield wire.EndInput()
                return
            elif kind == "text":
                text, voice = message.get("text"), message.get("voice", "")
                if not isinstance(text, str) or not isinstance(voice, str):
                    raise InvalidRequest("text: `text` (and `voice`) must be strings", field="text")
                yield wire.TextInput(text=text, voice=voice)
            else:
                raise InvalidRequest(
                    f"type: unknown message type {str(kind)[:40]!r} (session.cancel, session.close, "
                    "ping, text)",
                    field="type",
                )
        elif frame.type is WSMsgType.ERROR:
            return


def parse(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidRequest("type: not a JSON object", field="type") from None
    if not isinstance(data, dict):
        raise InvalidRequest("type: not a JSON object", field="type")
    return data


def session_open(message: dict[str, Any]) -> SessionSettings:
    """A session.create message as a SessionOpen's settings."""
    if message.get("type") != "session.create":
        raise InvalidRequest("type: the first message must be session.create", field="type")
    model, inputs, config = message.get("model"), message.get("inputs", {}), message.get("config", {})
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: required (a string)", field="model")
    if not isinstance(inputs, dict) or not isinstance(config, dict):
        raise InvalidRequest("inputs: `inputs` and `config` must be objects", field="inputs")
    opened = SessionSettings(model=model)
    image = inputs.get("image_b64")
    if image is not None:
        if not isinstance(image, str):
            raise InvalidRequest("inputs.image_b64: a base64 string", field="inputs.image_b64")
        try:
            data = base64.b64decode(image, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("inputs.image_b64: not base64", field="inputs.image_b64") from None
        opened.inputs.append(t.MediaInput(role=t.MediaRole.IMAGE, data=data))
    rest = dict(config)
    for name in (*OPEN_FIELDS, *EDGE_FIELDS):
        if name in rest:
            value = rest.pop(name)
            if not _fits(name, value):
                raise InvalidRequest(f"config.{name}: {value!r} is not valid here", field=f"config.{name}")
            if name in OPEN_FIELDS:
                setattr(opened, name, float(value) if name == "fps" else value)
    labels = rest.pop("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise InvalidRequest("config.labels: an object of strings", field="config.labels")
    opened.labels.update(labels)
    try:
        # Through a Struct, as a gRPC client's config comes: numbers are floats.
        opened.config = c.dict_from_struct(c.struct_from_dict(rest), finite=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"config: {exc}", field="config") from None
    return opened


def edge_options(message: dict[str, Any]) -> tuple[int, bool]:
    """What of a session.create (checked by `session_open`) this edge acts on itself: the
    `config.chunk_samples` asked for (0: the model's) and whether session.progress is wanted."""
    progress = message.get("progress", False)
    if not isinstance(progress, bool):
        raise InvalidRequest(f"progress: true or false (got {str(progress)[:40]!r})", field="progress")
    return int(message.get("config", {}).get("chunk_samples", 0)), progress


def _fits(name: str, value: Any) -> bool:
    """Whether `value` fits SessionOpen's field `name` as protobuf takes it: a string, a number
    (fps: a bool counts, as in Python), or a whole number in uint32's range (no bool)."""
    if name == "video_encoding":
        return isinstance(value, str)
    if name == "fps":  # any float (NaN, inf: check_open names `fps`), an int a float can hold
        return isinstance(value, float) or (isinstance(value, int) and abs(value) <= sys.float_info.max)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 32


def created(ready: wire.SessionReady) -> dict[str, Any]:
    encoding = "jpeg-seq" if ready.video_encoding in ("", "jpeg") else ready.video_encoding
    return {
        "type": "session.created",
        "session_id": ready.session_id,
        "trace_id": ready.trace_id,
        "model": ready.model,
        "audio": {
            "format": ready.audio_format or "pcm_s16le",
            "sample_rate": ready.sample_rate,
            "channels": ready.channels or 1,
            "chunk_samples": ready.chunk_samples,
        },
        "video": {
            "encoding": encoding,
            "wire_magic": VIDEO_MAGIC.decode(),
            "fps": ready.fps,
            "width": ready.width,
            "height": ready.height,
            "frames_per_chunk": ready.frames_per_chunk,
        },
    }


def video_message(frames: list[bytes]) -> bytes:
    """b"VIDX" + uint32 frame count + (uint32 length + JPEG) per frame, little-endian."""
    parts = [VIDEO_MAGIC, struct.pack("<I", len(frames))]
    for frame in frames:
        parts += [struct.pack("<I", len(frame)), frame]
    return b"".join(parts)


def json_of(message: Any) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
