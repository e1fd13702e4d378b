"""A realtime session's WorkerSession stream: its messages <-> plain values.

The one module of the session relay that reads or builds WorkerSession protobuf messages
(`omnirt._internal.protocol` does the same for the Connect stream); `host.py` works on the values
below, `Geometry` and `SessionReport`.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import realtime_pb2
from omnirt.worker.realtime.api import Geometry

AUDIO_FORMAT = "pcm_s16le"


@dataclass(frozen=True)
class AudioIn:
    """Input audio: `data` in the session's format; `sequence` 0 = the next one."""

    sequence: int
    data: bytes


@dataclass(frozen=True)
class TextIn:
    """Text for the session to speak."""

    text: str
    voice: str = ""


@dataclass(frozen=True)
class InterruptIn:
    """Drop the input not yet turned into output."""


@dataclass(frozen=True)
class EndIn:
    """No more input: finish what is held, then close."""


@dataclass(frozen=True)
class StopIn:
    """The controller ends the session now, for `reason`."""

    reason: str


SessionInput = AudioIn | TextIn | InterruptIn | EndIn | StopIn


@dataclass
class SessionReport:
    """A session summed up (omnirt.v1.SessionReport)."""

    chunks_in: int = 0
    chunks_out: int = 0
    first_chunk_latency_ms: float = 0.0
    mean_chunk_latency_ms: float = 0.0
    real_time_factor: float = 0.0
    underruns: int = 0
    duration_ms: float = 0.0
    worker_id: str = ""
    audio_ms: float = 0.0


def input_from_proto(msg: gateway_pb2.WorkerSessionResponse) -> SessionInput | None:
    """What the controller sent, or None for a message this worker does not know."""
    kind = msg.WhichOneof("message")
    if kind == "stop":
        return StopIn(msg.stop)
    if kind != "input":
        return None
    request = msg.input
    which = request.WhichOneof("message")
    if which == "audio":
        return AudioIn(request.audio.sequence, request.audio.data)
    if which == "text":
        return TextIn(request.text.text, request.text.voice)
    if which == "interrupt":
        return InterruptIn()
    if which == "end":
        return EndIn()
    return None  # `open` again, or a kind newer than this worker


def attach_message(
    session_id: str, worker_id: str, instance_id: str, token: str
) -> gateway_pb2.WorkerSessionRequest:
    """The first message of the stream: which offered session this worker takes up."""
    attach = gateway_pb2.SessionAttach(
        session_id=session_id, worker_id=worker_id, instance_id=instance_id, token=token
    )
    return gateway_pb2.WorkerSessionRequest(attach=attach)


def ready_message(
    *,
    session_id: str,
    model: str,
    trace_id: str,
    geometry: Geometry,
    video_encoding: str,
    max_buffered_samples: int,
) -> gateway_pb2.WorkerSessionRequest:
    """The session is open: how to feed it and what comes back."""
    ready = realtime_pb2.SessionReady(
        session_id=session_id,
        model=model,
        trace_id=trace_id,
        chunk_samples=geometry.chunk_samples,
        sample_rate=geometry.sample_rate,
        channels=geometry.channels,
        audio_format=AUDIO_FORMAT,
        video_encoding=video_encoding,
        fps=geometry.fps,
        width=geometry.width,
        height=geometry.height,
        frames_per_chunk=geometry.frames_per_chunk,
        max_buffered_samples=max_buffered_samples,
    )
    return gateway_pb2.WorkerSessionRequest(ready=ready)


def chunk_message(
    *,
    sequence: int,
    pts_ms: float,
    duration_ms: float,
    frames: list[bytes],
    segment: bytes,
    audio: bytes,
    sample_rate: int,
    latency_ms: float,
) -> gateway_pb2.WorkerSessionRequest:
    """One output chunk."""
    chunk = realtime_pb2.OutputChunk(
        sequence=sequence,
        pts_ms=pts_ms,
        duration_ms=duration_ms,
        frames=frames,
        segment=segment,
        audio=audio,
        sample_rate=sample_rate,
        latency_ms=latency_ms,
    )
    return gateway_pb2.WorkerSessionRequest(chunk=chunk)


def progress_message(
    *, chunks_in: int, chunks_out: int, lag_ms: float, buffered_samples: int
) -> gateway_pb2.WorkerSessionRequest:
    """How the session keeps up."""
    progress = realtime_pb2.SessionProgress(
        chunks_in=chunks_in, chunks_out=chunks_out, lag_ms=lag_ms, buffered_samples=buffered_samples
    )
    return gateway_pb2.WorkerSessionRequest(progress=progress)


def closed_message(reason: str, report: SessionReport) -> gateway_pb2.WorkerSessionRequest:
    """The session ended as it should (the last message)."""
    summary = realtime_pb2.SessionReport(
        chunks_in=report.chunks_in,
        chunks_out=report.chunks_out,
        first_chunk_latency_ms=report.first_chunk_latency_ms,
        mean_chunk_latency_ms=report.mean_chunk_latency_ms,
        real_time_factor=report.real_time_factor,
        underruns=report.underruns,
        duration_ms=report.duration_ms,
        worker_id=report.worker_id,
        audio_ms=report.audio_ms,
    )
    return gateway_pb2.WorkerSessionRequest(closed=realtime_pb2.SessionClosed(reason=reason, report=summary))


def error_message(error: t.JobError) -> gateway_pb2.WorkerSessionRequest:
    """The session was refused or failed (the last message)."""
    return gateway_pb2.WorkerSessionRequest(error=_convert.error_to_proto(error))
