"""Server streams over HTTP: Server-Sent Events, a WebSocket (which also takes commands), a download.

Every stream asks for its first message before sending headers, so an unknown job is a plain
404 JSON answer, not a stream that breaks. How an event is shown is the caller's (`Render`,
`Frame`): OmniRT's JobEvent JSON by default, the original OmniRT's records for its jobs
(`original_shape.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from omnirt.controller.core.bounds import echo
from omnirt.controller.http.errors import native_body
from omnirt.controller.http.security import WS_PROTOCOL
from omnirt.controller.http.transcode import to_json
from omnirt.errors import OmniRTError

log = logging.getLogger("omnirt.controller.http")
KEEPALIVE_S = 15.0
# A WebSocket command -> a coroutine that answers it with a JSON object to send back.
Command = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# A JobEvent message -> its SSE event name and JSON data (None: not sent).
Render = Callable[[Any], tuple[str, dict[str, Any]] | None]
# A JobEvent message -> its WebSocket frame (None: not sent).
Frame = Callable[[Any], dict[str, Any] | None]


def native_event(event: Any) -> tuple[str, dict[str, Any]]:
    """OmniRT's SSE event: the event's kind, and the JobEvent as JSON."""
    return event.WhichOneof("kind") or "message", to_json(event)


def native_frame(event: Any) -> dict[str, Any]:
    """OmniRT's WebSocket frame: `{"event": JobEvent}`."""
    return {"event": to_json(event)}


async def first_of(stream: AsyncIterator[Any]) -> Any:
    """The stream's first message (its errors raise here, before any header is sent)."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


def _sse(event: Any, render: Render) -> bytes:
    shown = render(event)
    if shown is None:
        return b""
    kind, data = shown
    return f"id: {event.sequence}\nevent: {kind}\ndata: {json.dumps(data)}\n\n".encode()


async def send_sse(
    request: web.Request, stream: AsyncGenerator[Any, None], render: Render = native_event
) -> web.StreamResponse:
    """`WatchJobResponse`s as `text/event-stream`: `id` = sequence, `event` = the event's kind.

    Nothing left to send (a finished job resumed past its last event) is 204, which tells an
    EventSource to stop reconnecting. A comment line every 15 s keeps idle proxies open.
    """
    item = await first_of(stream)
    if item is None:
        return web.Response(status=204)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    pending: asyncio.Future[Any] | None = None
    try:
        while item is not None:
            if chunk := _sse(item.event, render):
                await response.write(chunk)
            pending = asyncio.ensure_future(first_of(stream))
            while not (await asyncio.wait({pending}, timeout=KEEPALIVE_S))[0]:
                await response.write(b": keepalive\n\n")
            item = pending.result()
            pending = None
    except OmniRTError as exc:
        await response.write(f"event: error\ndata: {json.dumps(native_body(exc))}\n\n".encode())
    finally:
        if pending is not None:
            pending.cancel()
        with contextlib.suppress(Exception):
            await stream.aclose()
    await response.write_eof()
    return response


async def send_websocket(
    request: web.Request,
    stream: AsyncGenerator[Any, None],
    commands: dict[str, Command],
    *,
    frame: Frame = native_frame,
    key: str = "type",
) -> web.WebSocketResponse:
    """Events as `frame` makes them (`{"event": JobEvent}` text frames); `{KEY: NAME, ...}` frames
    (`key` "type") run `commands[NAME]`.

    A frame that is not a JSON object with a known `key` gets `{"error": {...}}` back and the
    socket stays open. The server closes (1000) after the job's final event.
    """
    first = await first_of(stream)
    ws = web.WebSocketResponse(heartbeat=30.0, protocols=(WS_PROTOCOL,))
    await ws.prepare(request)

    async def pump() -> None:
        item = first
        try:
            while item is not None:
                if (shown := frame(item.event)) is not None:
                    await ws.send_json(shown)
                item = await first_of(stream)
        except OmniRTError as exc:
            await ws.send_json(native_body(exc))
        await ws.close(code=1000, message=b"job finished")

    pump_task = asyncio.create_task(pump())
    try:
        async for message in ws:
            if message.type is WSMsgType.TEXT:
                await ws.send_json(await _command(message.data, commands, key))
            elif message.type is WSMsgType.BINARY:
                await ws.send_json(_ws_error("binary frames are not understood; send JSON text"))
    except ConnectionResetError:
        pass
    finally:
        pump_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump_task
        with contextlib.suppress(Exception):
            await stream.aclose()
    return ws


def _ws_error(message: str, field: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"code": "INVALID_ARGUMENT", "message": message}
    if field:
        body["field"] = field
    return {"error": body}


async def _command(text: str, commands: dict[str, Command], key: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except RecursionError:
        return _ws_error("not JSON this gateway reads: nested too deeply")
    except ValueError as exc:  # JSONDecodeError, and integers of more than 4300 digits
        return _ws_error(f"not JSON: {exc}")
    if not isinstance(data, dict) or not isinstance(data.get(key), str):
        return _ws_error(f'expected a JSON object with a "{key}" (one of: ' + ", ".join(commands) + ")", key)
    command = commands.get(data[key])
    if command is None:
        known = ", ".join(commands)
        return _ws_error(f"unknown message {key} {echo(data[key])} (known: {known})", key)
    try:
        return await command(data)
    except OmniRTError as exc:
        return native_body(exc)


async def send_download(request: web.Request, stream: AsyncIterator[Any]) -> web.StreamResponse:
    """`DownloadArtifactResponse` chunks as the artifact's bytes, with its type and name."""
    first = await first_of(stream)
    if first is None:
        return web.Response(status=204)
    meta = first.artifact
    headers = {"Content-Type": meta.mime_type or "application/octet-stream"}
    if meta.file_name:
        headers["Content-Disposition"] = f'inline; filename="{meta.file_name}"'
    if meta.sha256:
        headers["ETag"] = f'"{meta.sha256}"'
        headers["X-Omnirt-Sha256"] = meta.sha256
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    await response.write(first.chunk)
    async for item in stream:
        await response.write(item.chunk)
    await response.write_eof()
    return response
