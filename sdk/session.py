"""`RealtimeSession`: one realtime session of `Client.open_session` (RealtimeService.Session).

```python
with omnirt.Client() as client, client.open_session("tiny-talking-head", image="face.png") as s:
    s.send_audio(pcm_bytes)  # pcm_s16le at s.ready.sample_rate; any length
    s.end()  # no more input: the session finishes what it holds
    for chunk in s:  # OutputChunk messages, in order
        ...
    s.closed.reason, s.closed.report.real_time_factor
```

Sending never blocks the caller for long: messages wait in a queue that the gRPC call drains as
the server takes them (flow control). Iterating yields each `OutputChunk` (the generated
`omnirt.v1.realtime_pb2` message: frames, audio, pts) and keeps the last `SessionProgress` in
`progress`; it ends after `SessionClosed` (in `closed`). An error ends it with the OmniRTError
of the status (the field it names in `.field`).
"""

from __future__ import annotations

import queue
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import grpc

from omnirt import errors
from omnirt._internal import convert as conv
from omnirt._internal.requests import Media, media_input
from omnirt.types import MediaRole
from omnirt.v1 import realtime_pb2 as rt
from omnirt.v1 import types_pb2

_END = object()


def session_open(
    model: str,
    image: Media | None,
    *,
    video_encoding: str = "",
    fps: float = 0.0,
    width: int = 0,
    height: int = 0,
    sample_rate: int = 0,
    idle_timeout_ms: int = 0,
    labels: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> rt.SessionOpen:
    """The SessionOpen of `Client.open_session` / `AsyncClient.open_session`.

    `image` (the reference portrait) is bytes or a local file; a URI is refused.
    """
    opened = rt.SessionOpen(
        model=model, video_encoding=video_encoding, fps=fps, width=width, height=height,
        sample_rate=sample_rate, idle_timeout_ms=idle_timeout_ms, labels=dict(labels or {}),
    )  # fmt: skip
    if image is not None:
        media = media_input(MediaRole.IMAGE, image)
        if media.uri:
            raise errors.InvalidRequest(
                "image: a session's portrait is bytes or a file, not a URI", field="image"
            )
        opened.inputs.append(types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_IMAGE, data=media.data))
    if config:
        opened.config.CopyFrom(conv.struct_from_dict(dict(config)))
    return opened


class RealtimeSession:
    """An open realtime session; see the module docstring."""

    def __init__(self, stub: Any, opened: rt.SessionOpen, metadata: Any, address: str) -> None:
        self._outgoing: queue.Queue[Any] = queue.Queue()
        self._outgoing.put(rt.SessionRequest(open=opened))
        self._address = address
        self._call = stub.Session(self._requests(), metadata=metadata)
        self.progress: rt.SessionProgress | None = None
        self.closed: rt.SessionClosed | None = None
        first = self._next()
        if first is None or first.WhichOneof("message") != "ready":
            raise errors.Unavailable("the session ended before it was ready")
        self.ready: rt.SessionReady = first.ready

    def _requests(self) -> Iterator[rt.SessionRequest]:
        while (message := self._outgoing.get()) is not _END:
            yield message

    def _next(self) -> rt.SessionResponse | None:
        try:
            return next(self._call)
        except StopIteration:
            return None
        except grpc.RpcError as exc:
            raise errors.map_rpc_error(exc, self._address) from None

    @property
    def session_id(self) -> str:
        """The server's id of this session."""
        return self.ready.session_id

    def send_audio(self, pcm: bytes, sequence: int = 0) -> None:
        """PCM in the session's format (pcm_s16le, mono, at `ready.sample_rate`)."""
        self._outgoing.put(rt.SessionRequest(audio=rt.AudioChunk(sequence=sequence, data=bytes(pcm))))

    def send_text(self, text: str, voice: str = "") -> None:
        """Text to speak (a session driven by text)."""
        self._outgoing.put(rt.SessionRequest(text=rt.TextInput(text=text, voice=voice)))

    def interrupt(self) -> None:
        """Drop the input not yet turned into output; the session stays open."""
        self._outgoing.put(rt.SessionRequest(interrupt=rt.Interrupt()))

    def end(self) -> None:
        """No more input: the server finishes what it holds, then closes the session."""
        self._outgoing.put(rt.SessionRequest(end=rt.EndInput()))
        self._outgoing.put(_END)

    def __iter__(self) -> Iterator[rt.OutputChunk]:
        while (response := self._next()) is not None:
            kind = response.WhichOneof("message")
            if kind == "chunk":
                yield response.chunk
            elif kind == "progress":
                self.progress = response.progress
            elif kind == "closed":
                self.closed = response.closed

    def close(self) -> None:
        """End the session now (the server frees its slot at once)."""
        self._outgoing.put(_END)
        self._call.cancel()

    def __enter__(self) -> RealtimeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncRealtimeSession:
    """`RealtimeSession` for `AsyncClient`: the same methods, awaited; `async for` the chunks.

    Open it with `await client.open_session(...)`.
    """

    def __init__(self, stub: Any, metadata: Any, address: str) -> None:
        self._call = stub.Session(metadata=metadata)
        # Read through the call's async iterator, which ends at the stream's end, rather than
        # `read()`, whose end marker (grpc.aio.EOF) the grpc type stubs do not declare.
        self._responses: AsyncIterator[rt.SessionResponse] = aiter(self._call)
        self._address = address
        self.progress: rt.SessionProgress | None = None
        self.closed: rt.SessionClosed | None = None
        self.ready = rt.SessionReady()

    async def start(self, opened: rt.SessionOpen) -> AsyncRealtimeSession:
        """Send `opened` and wait for SessionReady (raises the refusal's OmniRTError)."""
        await self._write(rt.SessionRequest(open=opened))
        first = await self._read()
        if first is None or first.WhichOneof("message") != "ready":
            raise errors.Unavailable("the session ended before it was ready")
        self.ready = first.ready
        return self

    async def _write(self, message: rt.SessionRequest) -> None:
        try:
            await self._call.write(message)
        except grpc.RpcError as exc:
            raise errors.map_rpc_error(exc, self._address) from None

    async def _read(self) -> rt.SessionResponse | None:
        try:
            return await anext(self._responses, None)
        except grpc.RpcError as exc:
            raise errors.map_rpc_error(exc, self._address) from None

    @property
    def session_id(self) -> str:
        """The server's id of this session."""
        return self.ready.session_id

    async def send_audio(self, pcm: bytes, sequence: int = 0) -> None:
        """PCM in the session's format; waits while the server is behind (flow control)."""
        await self._write(rt.SessionRequest(audio=rt.AudioChunk(sequence=sequence, data=bytes(pcm))))

    async def send_text(self, text: str, voice: str = "") -> None:
        """Text to speak (a session driven by text)."""
        await self._write(rt.SessionRequest(text=rt.TextInput(text=text, voice=voice)))

    async def interrupt(self) -> None:
        """Drop the input not yet turned into output; the session stays open."""
        await self._write(rt.SessionRequest(interrupt=rt.Interrupt()))

    async def end(self) -> None:
        """No more input: the server finishes what it holds, then closes the session."""
        await self._write(rt.SessionRequest(end=rt.EndInput()))
        await self._call.done_writing()

    async def __aiter__(self) -> AsyncIterator[rt.OutputChunk]:
        while (response := await self._read()) is not None:
            kind = response.WhichOneof("message")
            if kind == "chunk":
                yield response.chunk
            elif kind == "progress":
                self.progress = response.progress
            elif kind == "closed":
                self.closed = response.closed

    def close(self) -> None:
        """End the session now (the server frees its slot at once)."""
        self._call.cancel()

    async def __aenter__(self) -> AsyncRealtimeSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
