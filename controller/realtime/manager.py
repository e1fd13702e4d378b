"""`SessionManager`: realtime sessions at the controller, from admission to the last chunk.

A session is placed on one connected worker that serves its model and has a free session slot
(warm first: the model already loaded there, then the fewest sessions), pinned there for its
life, and relayed both ways through two bounded `Pipe`s: the client's input to the worker's
WorkerSession stream, the worker's output to the client. Nothing is stored: a session lives in
the controller it was opened on (and, with Redis, is listed there for the others; see
`registry.py`). The edges (`servicer.py` for gRPC, `websocket.py` for the original OmniRT's
WebSocket protocol) call `open`, then `send` / `receive` / `stop` (through `relay.py`); the
worker's WorkerSession stream (`servicer.worker_session`) calls `attach` and fills the session's
pipe. Everything here is the plain messages of `omnirt._internal.protocol.realtime`: the edges
convert.

Flow: `open` checks the request, reserves a slot, sends SessionOffer on the worker's Connect
stream, waits for the worker's WorkerSession stream to attach (`ATTACH_TIMEOUT_S`) and for its
first message: SessionReady (returned) or an error (raised, the slot freed). The worker's
connection lost ends its sessions with UNAVAILABLE at once; a client gone (`stop`) sends the
worker `stop` and frees the slot when the worker's stream ends.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from omnirt._internal.protocol.messages import SessionOffer, SessionSettings
from omnirt._internal.protocol.realtime import (
    AudioChunk,
    ControllerSessionMessage,
    OutputChunk,
    SessionAttach,
    SessionFailed,
    SessionInput,
    SessionOutput,
    SessionReady,
    SessionRequest,
    Stop,
    TextInput,
)
from omnirt.controller.core.bounds import bad, check_extra, check_labels, check_length, echo
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.observability import tracing
from omnirt.controller.realtime.pipe import Pipe
from omnirt.controller.realtime.registry import RedisSessions, SessionRecord
from omnirt.errors import (
    FailedPrecondition,
    OmniRTError,
    PermissionDenied,
    QueueFull,
    Unavailable,
    error_for,
)
from omnirt.types import JobError, MediaRole, ModelSpec, WorkerInfo

log = logging.getLogger("omnirt.controller.realtime")

ATTACH_TIMEOUT_S = 15.0  # SessionOffer -> the worker's WorkerSession stream
READY_TIMEOUT_S = 600.0  # attach -> SessionReady (a cold model loads first; a 14B one ~90 s)
STOP_GRACE_S = 5.0  # stop -> the worker's SessionClosed, before the controller writes its own
PIPE_MESSAGES = 8  # each direction: messages in flight per session before the reader waits
DEFAULT_IDLE_TIMEOUT_MS = 30_000
MAX_IDLE_TIMEOUT_MS = 3_600_000
DEFAULT_MAX_DURATION_S = 3600.0
MAX_AUDIO_MESSAGE_BYTES = 1 << 20  # one AudioChunk: 32 s of 16 kHz mono PCM
MAX_TEXT_CHARS = 4096  # as OpenAI's speech input
MAX_REFERENCE_BYTES = 32 << 20
VIDEO_ENCODINGS = ("", "jpeg", "fmp4")
AUDIO_FORMATS = ("", "pcm_s16le")


@dataclass
class SessionWorker:
    """A connected worker that hosts sessions."""

    info: WorkerInfo
    slots: int
    send: Callable[[SessionOffer], None]
    sessions: set[str] = field(default_factory=set)
    draining: bool = False


@dataclass
class Session:
    """One open session, as the controller relays it."""

    id: str
    model: ModelSpec
    worker_id: str
    instance_id: str
    tenant: str
    trace_id: str
    opened_at: float = field(default_factory=time.monotonic)
    opened_wall: float = field(default_factory=time.time)
    labels: dict[str, str] = field(default_factory=dict)
    # client -> worker: its input, or a stop; worker -> client: ready, chunks, progress, the end
    to_worker: Pipe[ControllerSessionMessage] = field(default_factory=lambda: Pipe(PIPE_MESSAGES))
    from_worker: Pipe[SessionOutput] = field(default_factory=lambda: Pipe(PIPE_MESSAGES))
    attached: asyncio.Event = field(default_factory=asyncio.Event)
    stop_reason: str = ""
    ended: bool = False
    chunks_out: int = 0
    span: Any = None  # the session's OpenTelemetry span (tracing.session_span)


class SessionManager:
    """Admission, placement and the relay of realtime sessions (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        max_duration_s: float = DEFAULT_MAX_DURATION_S,
        name: str = "",
        shared: RedisSessions | None = None,
    ) -> None:
        self.catalog = catalog
        self.max_duration_s = max_duration_s
        self.name = name  # this controller, as listings name it (its listen address)
        self.shared = shared  # the listing of every controller's sessions (a Redis store)
        self.workers: dict[str, SessionWorker] = {}
        self.sessions: dict[str, Session] = {}
        self.metrics: Any = None  # SessionMetrics, set by the server
        self._unlisting: set[asyncio.Task[None]] = set()

    async def listed(self, model: str = "") -> list[SessionRecord]:
        """The open sessions (of `model`): every controller's with a shared listing, else ours."""
        ours = {s.id: self.record(s) for s in self.sessions.values() if s.attached.is_set()}
        shared = await self.shared.listed() if self.shared is not None else None
        merged = {r.session_id: r for r in shared or ()}
        merged.update(ours)
        records = sorted(merged.values(), key=lambda r: (r.opened_at, r.session_id))
        return [r for r in records if not model or r.model == model]

    def record(self, session: Session) -> SessionRecord:
        return SessionRecord(
            session_id=session.id, model=session.model.id, worker_id=session.worker_id,
            controller=self.name, tenant=session.tenant, opened_at=session.opened_wall,
            labels=session.labels,
        )  # fmt: skip

    # ---- workers -----------------------------------------------------------------------

    def worker_joined(
        self, info: WorkerInfo, slots: int, send: Callable[[SessionOffer], None]
    ) -> SessionWorker | None:
        """A worker's Connect stream is up; it hosts `slots` sessions (0: none)."""
        if slots <= 0:
            return None
        worker = SessionWorker(info, slots, send)
        previous = self.workers.get(info.id)
        if previous is not None:  # the same process on a new stream: its sessions go on
            worker.sessions = previous.sessions
        self.workers[info.id] = worker
        return worker

    def worker_beat(self, worker_id: str, loaded_models: list[str], draining: bool) -> None:
        worker = self.workers.get(worker_id)
        if worker is not None:
            worker.info.loaded_models = list(loaded_models)
            worker.draining = draining

    def worker_left(self, worker: SessionWorker) -> None:
        """The worker's Connect stream closed: its sessions end with UNAVAILABLE now (unless the
        same process is back on a new stream already)."""
        if self.workers.get(worker.info.id) is not worker:
            return
        del self.workers[worker.info.id]
        for session_id in list(worker.sessions):
            session = self.sessions.get(session_id)
            if session is not None:
                self._fail(session, "UNAVAILABLE", f"worker {worker.info.id} was lost; open a new session")

    # ---- open --------------------------------------------------------------------------

    async def open(self, request: SessionSettings, tenant: str = "") -> tuple[Session, SessionReady]:
        """Place and start a session; raises an OmniRTError when it cannot start."""
        spec = self.catalog.resolve(request.model)
        if not spec.streaming:
            raise FailedPrecondition(
                f"{spec.id} does not stream: realtime sessions need a streaming model (catalog "
                "`streaming = true`), not a job model",
                field="model",
            )
        check_open(request)
        worker = self._place(spec)
        session_id = f"sess-{uuid.uuid4().hex[:20]}"
        span, trace_id, trace_context = tracing.session_span(session_id, spec.id, tenant)
        session = Session(
            id=session_id,
            model=spec,
            worker_id=worker.info.id,
            instance_id=worker.info.instance_id,
            tenant=tenant,
            trace_id=trace_id or uuid.uuid4().hex,
            labels=dict(request.labels),
            span=span,
        )
        self.sessions[session.id] = session
        worker.sessions.add(session.id)
        self._count("opened", spec.id)
        try:
            settings = replace(request, model=spec.id)
            deadline = int((time.time() + self.max_duration_s) * 1000) if self.max_duration_s else 0
            worker.send(SessionOffer(session.id, spec, settings, trace_context, deadline))
            try:
                async with asyncio.timeout(ATTACH_TIMEOUT_S):
                    await session.attached.wait()
            except TimeoutError:
                raise Unavailable(
                    f"worker {worker.info.id} did not take the session within {ATTACH_TIMEOUT_S:.0f} s"
                ) from None
            async with asyncio.timeout(READY_TIMEOUT_S):
                first = await session.from_worker.get()
            if isinstance(first, SessionReady):
                ready = replace(first, session_id=session.id, model=spec.id, trace_id=session.trace_id)
                if self.shared is not None:
                    await self.shared.put(self.record(session))
                log.info(
                    "session %s of %s opened on worker %s", session.id, spec.id, worker.info.id,
                    extra={"trace_id": session.trace_id},
                )  # fmt: skip
                return session, ready
            raise error_of(first, f"worker {worker.info.id} ended the session before it was ready")
        except BaseException:
            self.release(session, "refused")
            raise

    def _place(self, spec: ModelSpec) -> SessionWorker:
        serving = [
            w
            for w in self.workers.values()
            if w.info.execution_mode == spec.execution_mode
            and (not w.info.models or spec.id in w.info.models)
        ]
        if not serving:
            raise Unavailable(f"no connected worker hosts sessions of {spec.id} ({spec.execution_mode} mode)")
        free = [w for w in serving if not w.draining and len(w.sessions) < w.slots]
        if not free:
            total = sum(w.slots for w in serving)
            raise QueueFull(
                f"every session slot of {spec.id} is taken ({total} on {len(serving)} worker(s)); "
                "retry when one ends",
                retry_after_s=1.0,
            )
        return min(free, key=lambda w: (spec.id not in w.info.loaded_models, len(w.sessions), w.info.id))

    # ---- the worker's stream -----------------------------------------------------------

    def attach(self, attach: SessionAttach) -> Session:
        """The worker's WorkerSession stream for `attach.session_id` (only the offered worker's)."""
        session = self.sessions.get(attach.session_id)
        if (
            session is None
            or session.worker_id != attach.worker_id
            or session.instance_id != attach.instance_id
            or session.attached.is_set()
        ):
            raise PermissionDenied(f"no session {echo(attach.session_id)} waits for this worker")
        session.attached.set()
        return session

    def worker_stream_ended(self, session: Session) -> None:
        """The worker's WorkerSession stream is over (after its last message, or broken)."""
        if not session.from_worker.finished:
            self._fail(session, "UNAVAILABLE", f"worker {session.worker_id} lost the session's stream")
        self.release(session, session.stop_reason or "ended")

    # ---- the client's side -------------------------------------------------------------

    async def send(self, session: Session, message: SessionInput) -> bool:
        """Relay one input message (waits while the worker is behind); False once it ended."""
        return await session.to_worker.put(message)

    async def receive(self, session: Session) -> SessionOutput | None:
        """The worker's next message (chunk, progress, closed, failed); None at the end."""
        message = await session.from_worker.get()
        if isinstance(message, OutputChunk):
            session.chunks_out += 1
            if self.metrics is not None:
                self.metrics.chunk(session.model.id)
        return message

    async def stop(self, session: Session, reason: str) -> None:
        """End the session now (client gone, idle timeout, maximum duration)."""
        if session.stop_reason or session.ended:
            return
        session.stop_reason = reason
        # A stop jumps the input queue: the worker must not compute what the client left behind.
        session.to_worker.finish(Stop(reason))
        if not session.attached.is_set():
            self.release(session, reason)

    def release(self, session: Session, reason: str) -> None:
        """Free the session's slot (idempotent)."""
        if session.ended:
            return
        session.ended = True
        session.to_worker.finish()
        session.from_worker.finish()
        self.sessions.pop(session.id, None)
        worker = self.workers.get(session.worker_id)
        if worker is not None:
            worker.sessions.discard(session.id)
        self._count(reason, session.model.id)
        if session.span is not None:
            tracing.end_session_span(session.span, reason, session.worker_id, session.chunks_out)
        if self.shared is not None:
            task = asyncio.get_running_loop().create_task(self.shared.drop(session.id))
            self._unlisting.add(task)
            task.add_done_callback(self._unlisting.discard)
        log.info(
            "session %s ended (%s) after %.1f s, %d chunk(s)", session.id, reason,
            time.monotonic() - session.opened_at, session.chunks_out, extra={"trace_id": session.trace_id},
        )  # fmt: skip

    def _fail(self, session: Session, code: str, message: str) -> None:
        session.from_worker.finish(SessionFailed(JobError(code, message)))
        session.to_worker.finish()

    def _count(self, outcome: str, model: str) -> None:
        if self.metrics is not None:
            self.metrics.session(outcome, model, self.active(model))

    def active(self, model: str = "") -> int:
        return sum(1 for s in self.sessions.values() if not model or s.model.id == model)


def error_of(message: SessionOutput | None, otherwise: str) -> OmniRTError:
    """The OmniRTError a worker's `error` message stands for (its code, message and field)."""
    if isinstance(message, SessionFailed):
        e = message.error
        return error_for(e.code or "INTERNAL", e.message or otherwise, field=e.field)
    return Unavailable(otherwise)


def check_open(request: SessionSettings) -> None:
    """Sizes and names of a SessionOpen (what the model makes of them is the worker's call)."""
    images = [m for m in request.inputs if m.role in (MediaRole.IMAGE, MediaRole.VIDEO)]
    if len(request.inputs) != len(images) or len(images) > 1:
        raise bad(
            "inputs", "one reference image (MEDIA_ROLE_IMAGE) or video (MEDIA_ROLE_VIDEO), nothing else"
        )
    for media in images:
        if media.uri or not media.data:
            raise bad("inputs.uri", "a session's reference is sent as bytes (`data`), not by URI")
        if len(media.data) > MAX_REFERENCE_BYTES:
            raise bad("inputs.data", f"at most {MAX_REFERENCE_BYTES} bytes (got {len(media.data)})")
        check_length("inputs.mime_type", media.mime_type, 128)
    if request.video_encoding not in VIDEO_ENCODINGS:
        raise bad("video_encoding", f"one of jpeg, fmp4 (got {echo(request.video_encoding)})")
    if request.audio_format not in AUDIO_FORMATS:
        raise bad("audio_format", f"pcm_s16le is the one audio format (got {echo(request.audio_format)})")
    if not math.isfinite(request.fps) or request.fps < 0 or request.fps > 240:
        raise bad("fps", f"0 (the model's) to 240 (got {request.fps})")
    for name in ("width", "height"):
        if getattr(request, name) > 8192:
            raise bad(name, f"at most 8192 (got {getattr(request, name)})")
    if request.sample_rate > 192_000:
        raise bad("sample_rate", f"at most 192000 (got {request.sample_rate})")
    if request.idle_timeout_ms > MAX_IDLE_TIMEOUT_MS:
        raise bad("idle_timeout_ms", f"at most {MAX_IDLE_TIMEOUT_MS} (got {request.idle_timeout_ms})")
    check_labels(request.labels)
    check_extra(request.config)


def check_input(message: SessionRequest | None) -> SessionInput:
    """An input message after the open (None: an empty one), checked for size; raises InvalidRequest."""
    if message is None:
        raise bad("message", "an empty SessionRequest")
    if isinstance(message, SessionSettings):
        raise bad("open", "the session is open already: SessionOpen is the first message only")
    if isinstance(message, AudioChunk) and len(message.data) > MAX_AUDIO_MESSAGE_BYTES:
        raise bad(
            "audio.data", f"at most {MAX_AUDIO_MESSAGE_BYTES} bytes a message (got {len(message.data)})"
        )
    if isinstance(message, TextInput):
        check_length("text.text", message.text, MAX_TEXT_CHARS)
        check_length("text.voice", message.voice, 128)
    return message
