"""A realtime session's messages as plain dataclasses, and one converter each way.

Two streams carry a session (docs/realtime.md). The client's `RealtimeService.Session`
(`omnirt.v1`): SessionOpen (`messages.SessionSettings`) then the input kinds below, answered by
SessionReady, OutputChunk, SessionProgress and SessionClosed. The worker's `WorkerSession`
(`omnirt.worker.v1`): the worker attaches (SessionAttach), then sends the same answers (or
SessionFailed); the controller relays the client's input to it, or `Stop`.

Each class is the proto message of the same name; the media they carry (audio, frames, a video
segment) stay bytes. The controller's realtime manager and the worker's session relay work on
these; the edges convert with the functions below (`request_from_proto` / `response_to_proto`
for the client's stream; `to_worker` / `from_controller` and `to_controller` / `from_worker`
for the worker's). A message this side does not know converts to None: a newer peer's message is
ignored, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omnirt import types as t
from omnirt._internal import convert as c
from omnirt._internal.protocol import convert as connect
from omnirt._internal.protocol.messages import SessionSettings
from omnirt._internal.protocol.v1 import gateway_pb2 as gw
from omnirt.v1 import realtime_pb2 as rt

# ---- the client's input (after SessionOpen), relayed to the worker -----------------------


@dataclass
class AudioChunk:
    """Input audio in the session's format; `sequence` 1, 2, 3, ... or 0 (the next one)."""

    sequence: int = 0
    data: bytes = b""


@dataclass
class TextInput:
    """Text for the session to speak; `voice` "" = the session's."""

    text: str = ""
    voice: str = ""


@dataclass
class Interrupt:
    """Drop the input not yet turned into output; the session stays open."""


@dataclass
class EndInput:
    """No more input: finish what is held, then close."""


SessionInput = AudioChunk | TextInput | Interrupt | EndInput
# A client's message: SessionOpen (as its settings) first, then input.
SessionRequest = SessionSettings | SessionInput


@dataclass
class Stop:
    """The controller ends the session now, for `reason` (client gone, idle timeout, ...)."""

    reason: str


ControllerSessionMessage = SessionInput | Stop

# ---- the session's answers, from the worker through the controller to the client --------


@dataclass
class SessionAttach:
    """The worker's first message on its WorkerSession stream: which offered session it takes."""

    session_id: str
    worker_id: str
    # The worker's Hello.instance_id: only the worker the session was offered to may attach.
    instance_id: str
    token: str = ""


@dataclass
class SessionReady:
    """The session is open: how to feed it and what comes back."""

    session_id: str = ""
    model: str = ""
    trace_id: str = ""
    chunk_samples: int = 0
    sample_rate: int = 0
    channels: int = 0
    audio_format: str = ""
    video_encoding: str = ""
    fps: float = 0.0
    width: int = 0
    height: int = 0
    frames_per_chunk: int = 0
    # The most input audio (samples) the session holds before the server stops reading.
    max_buffered_samples: int = 0


@dataclass
class OutputChunk:
    """One chunk of output: JPEG `frames` or one fMP4 `segment`, and/or the chunk's `audio`."""

    sequence: int = 0
    pts_ms: float = 0.0
    duration_ms: float = 0.0
    frames: list[bytes] = field(default_factory=list)
    segment: bytes = b""
    audio: bytes = b""
    sample_rate: int = 0
    # The input that completed this chunk reaching the worker -> this chunk leaving it.
    latency_ms: float = 0.0


@dataclass
class SessionProgress:
    """How the session keeps up."""

    chunks_in: int = 0
    chunks_out: int = 0
    lag_ms: float = 0.0
    buffered_samples: int = 0


@dataclass
class SessionReport:
    """A session summed up."""

    chunks_in: int = 0
    chunks_out: int = 0
    first_chunk_latency_ms: float = 0.0
    mean_chunk_latency_ms: float = 0.0
    real_time_factor: float = 0.0
    underruns: int = 0
    duration_ms: float = 0.0
    worker_id: str = ""
    audio_ms: float = 0.0


@dataclass
class SessionClosed:
    """The session ended as it should (the last message): "ended", "idle_timeout", ..."""

    reason: str = ""
    report: SessionReport = field(default_factory=SessionReport)


@dataclass
class SessionFailed:
    """The session was refused or failed (the worker's last message; the client sees a status)."""

    error: t.JobError


# What the client receives after the open (SessionResponse).
SessionResponse = SessionReady | OutputChunk | SessionProgress | SessionClosed
# What a worker sends on its WorkerSession stream after SessionAttach.
SessionOutput = SessionResponse | SessionFailed
WorkerSessionMessage = SessionAttach | SessionOutput

# ---- RealtimeService.Session (the controller's side of the client's stream) -------------


def request_from_proto(msg: rt.SessionRequest) -> SessionRequest | None:
    """A client's message; None for an empty one (or a kind newer than this side).

    A SessionOpen's config keeps NaN and infinities: the controller refuses them naming the key.
    """
    if msg.WhichOneof("message") == "open":
        return connect.session_settings_from_proto(msg.open, finite=False)
    return _input_from_proto(msg)


def _input_from_proto(msg: rt.SessionRequest) -> SessionInput | None:
    kind = msg.WhichOneof("message")
    if kind == "audio":
        return AudioChunk(msg.audio.sequence, msg.audio.data)
    if kind == "text":
        return TextInput(msg.text.text, msg.text.voice)
    if kind == "interrupt":
        return Interrupt()
    if kind == "end":
        return EndInput()
    return None


def request_to_proto(request: SessionRequest) -> rt.SessionRequest:
    """A client's message as it goes on the wire."""
    if isinstance(request, AudioChunk):
        return rt.SessionRequest(audio=rt.AudioChunk(sequence=request.sequence, data=request.data))
    if isinstance(request, TextInput):
        return rt.SessionRequest(text=rt.TextInput(text=request.text, voice=request.voice))
    if isinstance(request, Interrupt):
        return rt.SessionRequest(interrupt=rt.Interrupt())
    if isinstance(request, EndInput):
        return rt.SessionRequest(end=rt.EndInput())
    if isinstance(request, SessionSettings):
        return rt.SessionRequest(open=connect.session_settings_to_proto(request))
    raise TypeError(f"not a session request: {request!r}")


def response_to_proto(response: SessionResponse) -> rt.SessionResponse:
    """An answer to the client as it goes on the wire."""
    if isinstance(response, OutputChunk):
        return rt.SessionResponse(chunk=_chunk_to_proto(response))
    if isinstance(response, SessionProgress):
        return rt.SessionResponse(progress=progress_to_proto(response))
    if isinstance(response, SessionReady):
        return rt.SessionResponse(ready=_ready_to_proto(response))
    if isinstance(response, SessionClosed):
        return rt.SessionResponse(closed=_closed_to_proto(response))
    raise TypeError(f"not a session response: {response!r}")


# ---- WorkerSession: controller -> worker -------------------------------------------------


def to_worker(message: ControllerSessionMessage) -> gw.WorkerSessionResponse:
    """The client's input, or a stop, as it goes down the worker's session stream."""
    if isinstance(message, Stop):
        return gw.WorkerSessionResponse(stop=message.reason)
    return gw.WorkerSessionResponse(input=request_to_proto(message))


def from_controller(msg: gw.WorkerSessionResponse) -> ControllerSessionMessage | None:
    """What the controller sent; None for a kind this worker does not know (or `open` again)."""
    kind = msg.WhichOneof("message")
    if kind == "stop":
        return Stop(msg.stop)
    if kind == "input":
        return _input_from_proto(msg.input)
    return None


# ---- WorkerSession: worker -> controller -------------------------------------------------


def to_controller(message: WorkerSessionMessage) -> gw.WorkerSessionRequest:
    """A worker's session message as it goes up its session stream."""
    if isinstance(message, OutputChunk):
        return gw.WorkerSessionRequest(chunk=_chunk_to_proto(message))
    if isinstance(message, SessionProgress):
        return gw.WorkerSessionRequest(progress=progress_to_proto(message))
    if isinstance(message, SessionReady):
        return gw.WorkerSessionRequest(ready=_ready_to_proto(message))
    if isinstance(message, SessionClosed):
        return gw.WorkerSessionRequest(closed=_closed_to_proto(message))
    if isinstance(message, SessionFailed):
        return gw.WorkerSessionRequest(error=c.error_to_proto(message.error))
    if isinstance(message, SessionAttach):
        attach = gw.SessionAttach(
            session_id=message.session_id,
            worker_id=message.worker_id,
            instance_id=message.instance_id,
            token=message.token,
        )
        return gw.WorkerSessionRequest(attach=attach)
    raise TypeError(f"not a worker session message: {message!r}")


def from_worker(msg: gw.WorkerSessionRequest) -> WorkerSessionMessage | None:
    """A worker's session message; None for a kind this controller does not know."""
    kind = msg.WhichOneof("message")
    if kind == "chunk":
        return _chunk_from_proto(msg.chunk)
    if kind == "progress":
        p = msg.progress
        return SessionProgress(p.chunks_in, p.chunks_out, p.lag_ms, p.buffered_samples)
    if kind == "ready":
        return _ready_from_proto(msg.ready)
    if kind == "closed":
        return SessionClosed(msg.closed.reason, _report_from_proto(msg.closed.report))
    if kind == "error":
        return SessionFailed(c.error_from_proto(msg.error))
    if kind == "attach":
        a = msg.attach
        return SessionAttach(a.session_id, a.worker_id, a.instance_id, a.token)
    return None


# ---- the parts -----------------------------------------------------------------------------


def _ready_to_proto(r: SessionReady) -> rt.SessionReady:
    return rt.SessionReady(
        session_id=r.session_id,
        model=r.model,
        trace_id=r.trace_id,
        chunk_samples=r.chunk_samples,
        sample_rate=r.sample_rate,
        channels=r.channels,
        audio_format=r.audio_format,
        video_encoding=r.video_encoding,
        fps=r.fps,
        width=r.width,
        height=r.height,
        frames_per_chunk=r.frames_per_chunk,
        max_buffered_samples=r.max_buffered_samples,
    )


def _ready_from_proto(r: rt.SessionReady) -> SessionReady:
    return SessionReady(
        session_id=r.session_id,
        model=r.model,
        trace_id=r.trace_id,
        chunk_samples=r.chunk_samples,
        sample_rate=r.sample_rate,
        channels=r.channels,
        audio_format=r.audio_format,
        video_encoding=r.video_encoding,
        fps=r.fps,
        width=r.width,
        height=r.height,
        frames_per_chunk=r.frames_per_chunk,
        max_buffered_samples=r.max_buffered_samples,
    )


def _chunk_to_proto(k: OutputChunk) -> rt.OutputChunk:
    return rt.OutputChunk(
        sequence=k.sequence,
        pts_ms=k.pts_ms,
        duration_ms=k.duration_ms,
        frames=k.frames,
        segment=k.segment,
        audio=k.audio,
        sample_rate=k.sample_rate,
        latency_ms=k.latency_ms,
    )


def _chunk_from_proto(k: rt.OutputChunk) -> OutputChunk:
    return OutputChunk(
        sequence=k.sequence,
        pts_ms=k.pts_ms,
        duration_ms=k.duration_ms,
        frames=list(k.frames),
        segment=k.segment,
        audio=k.audio,
        sample_rate=k.sample_rate,
        latency_ms=k.latency_ms,
    )


def progress_to_proto(p: SessionProgress) -> rt.SessionProgress:
    """A SessionProgress as its message (the WebSocket edge writes it as protobuf's JSON)."""
    return rt.SessionProgress(
        chunks_in=p.chunks_in, chunks_out=p.chunks_out, lag_ms=p.lag_ms, buffered_samples=p.buffered_samples
    )


def report_to_proto(r: SessionReport) -> rt.SessionReport:
    """A SessionReport as its message (the WebSocket edge writes it as protobuf's JSON)."""
    return rt.SessionReport(
        chunks_in=r.chunks_in,
        chunks_out=r.chunks_out,
        first_chunk_latency_ms=r.first_chunk_latency_ms,
        mean_chunk_latency_ms=r.mean_chunk_latency_ms,
        real_time_factor=r.real_time_factor,
        underruns=r.underruns,
        duration_ms=r.duration_ms,
        worker_id=r.worker_id,
        audio_ms=r.audio_ms,
    )


def _report_from_proto(r: rt.SessionReport) -> SessionReport:
    return SessionReport(
        chunks_in=r.chunks_in,
        chunks_out=r.chunks_out,
        first_chunk_latency_ms=r.first_chunk_latency_ms,
        mean_chunk_latency_ms=r.mean_chunk_latency_ms,
        real_time_factor=r.real_time_factor,
        underruns=r.underruns,
        duration_ms=r.duration_ms,
        worker_id=r.worker_id,
        audio_ms=r.audio_ms,
    )


def _closed_to_proto(closed: SessionClosed) -> rt.SessionClosed:
    return rt.SessionClosed(reason=closed.reason, report=report_to_proto(closed.report))
