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
from collections.abc import Iterator
from typing import Any

import grpc

from omnirt import errors
from omnirt.v1 import realtime_pb2 as rt

_END = object()


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
        from omnirt.client import map_rpc_error

        try:
            return next(self._call)
        except StopIteration:
            return None
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self._address) from None

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
