"""`SessionHost`: one realtime session the controller offered this worker, relayed to its model.

The daemon runs one `SessionHost.run()` task per SessionOffer. It dials
`WorkerGatewayService.WorkerSession` on the Connect stream's channel, sends `attach`, opens the
session on the executor (`Executor.open_session`, in a thread: it may load the model) and answers
`ready` with the model's geometry, or `error` (a JobError naming the field) and ends.

Then three things run at once until the session ends:

- the reader takes the controller's input: audio is appended to a buffer of int16 samples (the
  arrival time of the message that completes each `chunk_samples` is kept, for the chunk's
  latency); `interrupt` drops what is buffered; `end` zero-pads a partial last chunk; `text` is
  refused unless the session speaks (`SpeaksText`). While the buffer holds `max_buffered_samples`
  or more the reader stops reading, so HTTP/2 flow control slows the controller and, through it,
  the client: a session's memory stays bounded however fast audio is sent.
- the speaker, for a session that speaks: each `text` is synthesized piece by piece in a thread
  (`speak`) and each piece appended to the buffer as it comes, waiting for room as the reader
  does. Input that arrives while a text is spoken (audio, more text, `end`) waits in a short
  queue behind it, so the buffer takes input in the order sent; `interrupt` drops the queue and
  the speech not yet in the buffer.
- the pusher turns each full chunk into output, one push at a time in a thread, and sends it
  (`chunk`, then `progress`); after `end` and the last chunk it sends `closed` "ended".
- the session's deadline (SessionOffer.deadline_ms) ends it with `closed` "max_duration".

Whoever ends the session settles one outcome: closed (with its reason and the report), an error,
or a broken stream (nothing more is sent). The stream's reads and writes are never cancelled
while it lives (grpc.aio cancels the whole call when a pending read or write is): the pusher is
told to stop and awaited, and the reader ends when the controller closes the stream after the
last message. The model's session is closed in every case, freeing the slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from omnirt import types as t
from omnirt._internal.protocol import realtime as wire
from omnirt._internal.protocol.messages import SessionOffer, SessionSettings
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.worker.modes.events import trace_id
from omnirt.worker.modes.executor import Executor
from omnirt.worker.realtime import media
from omnirt.worker.realtime.api import (
    ChunkOut,
    Geometry,
    OpenRequest,
    SessionRefused,
    SpeaksText,
    StreamingSession,
)
from omnirt.worker.realtime.checks import MAX_BUFFERED_CHUNKS, check_audio, check_geometry, check_settings
from omnirt.worker.realtime.stats import SessionStats
from omnirt.worker.redact import public_error
from omnirt.worker.telemetry import job_context

log = logging.getLogger(__name__)

# The sentinel read() returns at the end of a stream, looked up by name: grpc-stubs lack it.
STREAM_END: Any = vars(grpc.aio)["EOF"]
# Inputs that may wait behind a text being spoken (each text at most 4096 characters).
MAX_QUEUED_INPUTS = 16
# After the end: time for a push in flight and the last writes, then for the controller to close.
STOP_GRACE_S = 10.0
CLOSE_WAIT_S = 5.0
# What a read or write raises once the call is over (failed, cancelled, or ended by the peer).
STREAM_ERRORS = (asyncio.InvalidStateError, grpc.aio.AioRpcError)


class SessionHost:
    """The relay of one offered session; `run()` is its whole life, `stop()` ends it early."""

    def __init__(
        self,
        offer: SessionOffer,
        executor: Executor,
        channel: Any,
        *,
        worker_id: str,
        instance_id: str,
        token: str = "",
        metadata: tuple[tuple[str, str], ...] = (),
        refusal: t.JobError | None = None,
        model_dir: str = "",
        on_release: Callable[[], None] | None = None,
    ) -> None:
        self.offer = offer
        self.session_id = offer.session_id
        self._executor = executor
        self._channel = channel
        self._worker_id, self._instance_id, self._token = worker_id, instance_id, token
        self._metadata = metadata
        self._refusal = refusal or offer.error
        self._model_dir = model_dir
        self._on_release = on_release  # the daemon frees the session's slot
        self._call: Any = None
        self._stream: StreamingSession | None = None
        self._model_lock = threading.Lock()  # push and close: one at a time, in any thread
        self._outcome: asyncio.Future[tuple[str, Any]] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()  # int16 little-endian samples not yet pushed
        self._ready_at: deque[float] = deque()  # one arrival time per full chunk in the buffer
        self._wake = asyncio.Event()  # pusher: a full chunk, the end or the outcome
        self._room = asyncio.Event()  # reader: the buffer has room again, or the outcome
        self._ended = False  # the end reached the buffer: the pusher finishes what it holds
        self._input_closed = False  # `end` was read (it may still wait behind speech)
        # Inputs behind a text being spoken, with their arrival times, and the audio among them.
        self._queued: deque[tuple[wire.SessionInput, float]] = deque()
        self._queued_samples = 0
        self._speaking = False  # the speaker holds an input (a text, or audio queued behind one)
        self._turn = asyncio.Event()  # speaker: an input queued, or the outcome
        self._interrupts = 0  # speech begun before the latest interrupt is dropped
        self._geometry: Geometry | None = None
        self._stats: SessionStats | None = None
        self._encoding = media.JPEG

    # ---- public --------------------------------------------------------------------------

    def stop(self, reason: str) -> None:
        """End the session now with `closed` `reason` (the daemon's drain or shutdown)."""
        self._settle("closed", reason)

    async def run(self) -> None:
        """Attach, open, relay until the end; never raises (but for cancellation)."""
        with job_context([self.session_id], "", trace_id(self.offer.trace_context)):
            stub = gateway_pb2_grpc.WorkerGatewayServiceStub(self._channel)
            self._call = call = stub.WorkerSession(metadata=self._metadata)
            try:
                await self._write(
                    wire.SessionAttach(self.session_id, self._worker_id, self._instance_id, self._token)
                )
                error = self._refusal or await self._open()
                if error is not None:
                    log.info("session refused: %s %s", error.code, error.message)
                    await self._end_model()
                    await self._finish(wire.SessionFailed(self._public(error)))
                    await self._until_closed()
                    return
                await self._relay()
            except STREAM_ERRORS as exc:
                log.info("session stream ended: %s", _stream_error(exc))
            except Exception as exc:
                log.exception("session failed")
                await self._end_model()
                with contextlib.suppress(*STREAM_ERRORS):
                    error = t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
                    await self._finish(wire.SessionFailed(error))
            finally:
                await self._end_model()
                call.cancel()

    # ---- open ----------------------------------------------------------------------------

    async def _open(self) -> t.JobError | None:
        settings: SessionSettings = self.offer.settings
        problem = check_settings(settings)
        if problem is not None:
            return problem
        self._encoding = settings.video_encoding or media.JPEG
        request = OpenRequest(
            session_id=self.session_id,
            model=self.offer.model,
            reference_image=settings.reference_image,
            config=dict(settings.config),
            width=settings.width,
            height=settings.height,
            fps=settings.fps,
            sample_rate=settings.sample_rate,
            deadline_ms=self.offer.deadline_ms,
        )
        try:
            self._stream = await asyncio.to_thread(self._executor.open_session, request)
        except SessionRefused as exc:
            return t.JobError(exc.code, exc.message, exc.field)
        except Exception as exc:  # a bug in a mode costs this session, not the worker
            log.exception("open_session failed")
            return t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
        self._geometry = self._stream.geometry
        return check_geometry(settings, self._geometry)

    # ---- relay ---------------------------------------------------------------------------

    @property
    def max_buffered_samples(self) -> int:
        """The most input audio the session holds before it stops reading."""
        assert self._geometry is not None
        return MAX_BUFFERED_CHUNKS * self._geometry.chunk_samples

    async def _relay(self) -> None:
        assert self._geometry is not None
        geometry = self._geometry
        self._stats = SessionStats(self._worker_id, geometry.sample_rate)
        ready = wire.SessionReady(
            session_id=self.session_id,
            model=self.offer.model.id,
            trace_id=trace_id(self.offer.trace_context),
            chunk_samples=geometry.chunk_samples,
            sample_rate=geometry.sample_rate,
            channels=geometry.channels,
            audio_format=media.AUDIO_FORMAT,
            video_encoding=self._encoding,
            fps=geometry.fps,
            width=geometry.width,
            height=geometry.height,
            frames_per_chunk=geometry.frames_per_chunk,
            max_buffered_samples=self.max_buffered_samples,
        )
        await self._write(ready)
        log.info("session open: model %s, %d-sample chunks", self.offer.model.id, geometry.chunk_samples)
        reader = asyncio.create_task(self._read_loop(), name=f"omnirt-session-read-{self.session_id}")
        pusher = asyncio.create_task(self._push_loop(), name=f"omnirt-session-push-{self.session_id}")
        timer = asyncio.create_task(self._deadline())
        speaker = asyncio.create_task(self._speak_loop(), name=f"omnirt-session-speak-{self.session_id}")
        try:
            kind, value = await self._outcome
            timer.cancel()
            speaker.cancel()  # a synthesis in flight finishes in its thread; its audio is dropped
            if kind == "broken":
                log.info("session stream broke: %s", value)
                return
            # The push in flight finishes (its output is dropped) and a write in flight completes.
            _, late = await asyncio.wait([pusher], timeout=STOP_GRACE_S)
            if late:
                log.warning("session: output still blocked after %.0f s; cancelling the stream", STOP_GRACE_S)
                return  # the finally below cancels the pusher, and with its write the call
            await self._end_model()
            if kind == "closed":
                report = self._stats.report()
                log.info(
                    "session closed (%s): %d chunk(s) in, %d out, real-time factor %.2f, %d underrun(s)",
                    value,
                    report.chunks_in,
                    report.chunks_out,
                    report.real_time_factor,
                    report.underruns,
                )
                await self._finish(wire.SessionClosed(value, report))
            else:
                log.info("session failed: %s %s", value.code, value.message)
                await self._finish(wire.SessionFailed(self._public(value)))
            await asyncio.wait([reader], timeout=CLOSE_WAIT_S)  # the controller closes after the last message
        finally:
            for task in (timer, speaker, pusher, reader):
                task.cancel()
            await asyncio.gather(timer, speaker, pusher, reader, return_exceptions=True)

    async def _write(self, message: wire.WorkerSessionMessage) -> None:
        await self._call.write(wire.to_controller(message))

    async def _finish(self, message: wire.SessionClosed | wire.SessionFailed) -> None:
        """The last message, then half-close."""
        await self._write(message)
        await self._call.done_writing()

    async def _until_closed(self) -> None:
        """Read (and drop) until the controller ends the call, for at most CLOSE_WAIT_S: a call
        cancelled at once could lose the last message before the controller reads it."""
        with contextlib.suppress(TimeoutError, *STREAM_ERRORS):
            async with asyncio.timeout(CLOSE_WAIT_S):
                while await self._call.read() is not STREAM_END:
                    pass

    def _settle(self, kind: str, value: Any) -> None:
        """End the session (the first outcome wins): "closed" reason, "error" JobError, "broken"."""
        if not self._outcome.done():
            self._outcome.set_result((kind, value))
        self._wake.set()
        self._room.set()
        self._turn.set()

    async def _deadline(self) -> None:
        if self.offer.deadline_ms <= 0:
            return
        await asyncio.sleep(max(0.0, self.offer.deadline_ms / 1000.0 - time.time()))
        self._settle("closed", "max_duration")

    # ---- input ---------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        call = self._call
        while True:
            while (
                (
                    len(self._buffer) // 2 + self._queued_samples >= self.max_buffered_samples
                    or len(self._queued) >= MAX_QUEUED_INPUTS
                )
                and not self._input_closed
                and not self._outcome.done()
            ):
                self._room.clear()
                await self._room.wait()  # backpressure: unread input waits in HTTP/2 windows
            try:
                msg = await call.read()
            except STREAM_ERRORS as exc:
                self._settle("broken", _stream_error(exc))
                return
            if msg is STREAM_END:
                self._settle("closed", "cancelled")  # the controller ended the input without `end`
                return
            if self._outcome.done():
                continue  # the session is ending: read until the controller closes
            problem = self._take(wire.from_controller(msg), time.monotonic())
            if problem is not None:
                self._settle("error", problem)

    def _take(self, item: wire.SessionInput | wire.Stop | None, at: float) -> t.JobError | None:
        """Act on one input; the JobError that ends the session, or None."""
        assert self._geometry is not None and self._stats is not None
        if isinstance(item, wire.Stop):
            self._settle("closed", item.reason or "cancelled")
        elif isinstance(item, wire.AudioChunk):
            return self._take_audio(item, at)
        elif isinstance(item, wire.Interrupt):
            dropped = len(self._buffer) // 2 + self._queued_samples
            self._interrupts += 1
            self._buffer.clear()
            self._ready_at.clear()
            self._queued.clear()
            self._queued_samples = 0
            self._room.set()
            if self._input_closed and not self._ended:
                self._end_input(at)  # the end was queued behind the dropped speech
            log.debug("interrupt: dropped %d buffered sample(s) and the speech not yet buffered", dropped)
        elif isinstance(item, wire.TextInput):
            if not isinstance(self._stream, SpeaksText):
                return t.JobError(
                    "FAILED_PRECONDITION",
                    f"model {self.offer.model.id!r} is driven by audio, not text",
                    "text",
                )
            if self._input_closed:
                return t.JobError("FAILED_PRECONDITION", "text after end: the input is closed", "text")
            self._queue(item, at)
        elif isinstance(item, wire.EndInput):
            self._input_closed = True
            if self._behind_speech():
                self._queue(item, at)
            else:
                self._end_input(at)
        return None

    def _end_input(self, at: float) -> None:
        """The end reaches the buffer: a partial last chunk is padded, the pusher finishes."""
        assert self._geometry is not None
        chunk_bytes = 2 * self._geometry.chunk_samples
        partial = len(self._buffer) % chunk_bytes
        if partial:  # the last words still get their frames: the chunk is filled with silence
            self._buffer.extend(bytes(chunk_bytes - partial))
            self._ready_at.append(at)
        self._ended = True
        self._wake.set()

    def _behind_speech(self) -> bool:
        """Whether new input must wait behind a text (being spoken or queued)."""
        return self._speaking or bool(self._queued)

    def _queue(self, item: wire.SessionInput, at: float) -> None:
        self._queued.append((item, at))
        if isinstance(item, wire.AudioChunk):
            self._queued_samples += len(item.data) // 2
        self._turn.set()

    def _take_audio(self, audio: wire.AudioChunk, at: float) -> t.JobError | None:
        assert self._geometry is not None and self._stats is not None
        problem = check_audio(
            audio,
            self._geometry,
            model_id=self.offer.model.id,
            expected=self._stats.chunks_in + 1,
            closed=self._input_closed,
        )
        if problem is not None:
            return problem
        self._stats.audio_received(len(audio.data) // 2, at)
        if self._behind_speech():
            self._queue(audio, at)
        else:
            self._append(audio.data, at)
        return None

    def _append(self, data: bytes, at: float) -> None:
        """Samples into the buffer; each chunk they complete is ready for the pusher."""
        assert self._geometry is not None
        chunk_bytes = 2 * self._geometry.chunk_samples
        before = len(self._buffer) // chunk_bytes
        self._buffer.extend(data)
        completed = len(self._buffer) // chunk_bytes - before
        self._ready_at.extend([at] * completed)
        if completed:
            self._wake.set()

    # ---- speech --------------------------------------------------------------------------

    async def _speak_loop(self) -> None:
        """Take the queued inputs in order: speak each text, pass audio and `end` on."""
        while not self._outcome.done():
            if not self._queued:
                self._turn.clear()
                await self._turn.wait()
                continue
            item, at = self._queued.popleft()
            self._room.set()  # the reader may wait on the queue's length
            self._speaking = True
            try:
                if isinstance(item, wire.TextInput):
                    problem = await self._speak(item, at)
                    if problem is not None:
                        self._settle("error", problem)
                        return
                elif isinstance(item, wire.AudioChunk):
                    self._queued_samples -= len(item.data) // 2
                    await self._feed(item.data, at, self._interrupts)
                elif isinstance(item, wire.EndInput):
                    self._end_input(at)
            finally:
                self._speaking = False

    async def _speak(self, text: wire.TextInput, at: float) -> t.JobError | None:
        """One text, synthesized piece by piece (in a thread) into the buffer."""
        assert isinstance(self._stream, SpeaksText) and self._stats is not None
        stream, epoch = self._stream, self._interrupts
        try:
            pieces = await asyncio.to_thread(stream.speak, text.text, text.voice)
            while self._current(epoch):
                piece = await asyncio.to_thread(next, pieces, None)
                if piece is None or not self._current(epoch):
                    break
                data = piece.astype("<i2").tobytes()
                if await self._feed(data, at, epoch):
                    self._stats.speech_received(len(piece), at)
        except SessionRefused as exc:
            return t.JobError(exc.code, exc.message, exc.field)
        except Exception as exc:
            log.exception("speech synthesis failed")
            return t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
        return None

    def _current(self, epoch: int) -> bool:
        """Whether speech begun at `epoch` still goes on: no interrupt since, no outcome."""
        return epoch == self._interrupts and not self._outcome.done()

    async def _feed(self, data: bytes, at: float, epoch: int) -> bool:
        """`data` into the buffer a chunk at a time, each once there is room; False when an
        interrupt (after `epoch`) or the outcome came first (the rest is dropped)."""
        assert self._geometry is not None
        chunk_bytes = 2 * self._geometry.chunk_samples
        limit = 2 * self.max_buffered_samples
        for start in range(0, len(data), chunk_bytes):
            part = data[start : start + chunk_bytes]
            while (
                len(self._buffer) + len(part) > limit
                and not self._outcome.done()
                and epoch == self._interrupts
            ):
                self._room.clear()
                await self._room.wait()
            if not self._current(epoch):
                return False
            self._append(part, at)
        return True

    # ---- output --------------------------------------------------------------------------

    async def _push_loop(self) -> None:
        assert self._geometry is not None and self._stats is not None
        geometry, stats = self._geometry, self._stats
        chunk_bytes = 2 * geometry.chunk_samples
        duration_ms = geometry.chunk_samples * 1000.0 / geometry.sample_rate
        sequence = 0
        while not self._outcome.done():
            if not self._ready_at:
                if self._ended:
                    self._settle("closed", "ended")
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            pcm = np.frombuffer(bytes(self._buffer[:chunk_bytes]), dtype="<i2").astype(np.int16)
            del self._buffer[:chunk_bytes]
            ready_at = self._ready_at.popleft()
            self._room.set()
            try:
                out, pushed_s, encoded = await asyncio.to_thread(self._push, pcm)
            except SessionRefused as exc:
                self._settle("error", t.JobError(exc.code, exc.message, exc.field))
                return
            except Exception as exc:
                log.exception("push failed")
                self._settle("error", t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}"))
                return
            stats.pushed(pushed_s)
            if self._outcome.done():
                return  # stopped (or interrupted for good) while this chunk was made
            sequence += 1
            latency_ms, lag_ms = stats.chunk_sent(out.pts_ms, duration_ms, ready_at, time.monotonic())
            as_frames = self._encoding == media.JPEG or not encoded  # a speech session: neither
            frames, segment = (encoded, b"") if as_frames else ([], encoded[0])
            chunk = wire.OutputChunk(
                sequence=sequence,
                pts_ms=out.pts_ms,
                duration_ms=duration_ms,
                frames=frames,
                segment=segment,
                audio=out.audio.astype("<i2").tobytes(),
                sample_rate=geometry.sample_rate,
                latency_ms=latency_ms,
            )
            await self._write(chunk)
            await self._write(
                wire.SessionProgress(
                    chunks_in=stats.chunks_in,
                    chunks_out=stats.chunks_out,
                    lag_ms=lag_ms,
                    buffered_samples=len(self._buffer) // 2,
                )
            )

    def _push(self, pcm: np.ndarray) -> tuple[ChunkOut, float, list[bytes]]:
        """In a thread: one push (timed) and its frames encoded."""
        assert self._stream is not None and self._geometry is not None
        with self._model_lock:
            started = time.perf_counter()
            out = self._stream.push(pcm)
            pushed_s = time.perf_counter() - started
        if not len(out.frames):  # a speech session: audio only
            return out, pushed_s, []
        if self._encoding == media.JPEG:
            return out, pushed_s, media.jpeg_frames(out.frames)
        return out, pushed_s, [media.fmp4_segment(out.frames, self._geometry.fps)]

    # ---- end -----------------------------------------------------------------------------

    async def _end_model(self) -> None:
        """Close the model's session and free the slot (idempotent): before the last message, so
        a controller that offers the next session as soon as it reads `closed` finds the slot free."""
        stream, self._stream = self._stream, None
        release, self._on_release = self._on_release, None
        if stream is not None:
            await self._close_model(stream)
        if release is not None:
            release()

    async def _close_model(self, stream: StreamingSession) -> None:
        def close() -> None:
            with self._model_lock:  # after a push still in flight
                stream.close()

        try:
            await asyncio.shield(asyncio.to_thread(close))
        except Exception:
            log.exception("closing the session's model state failed")

    def _public(self, error: t.JobError) -> t.JobError:
        """`error` without this worker's folders."""
        return public_error(error, {self._model_dir: "MODEL_DIR"}, keep=[self.offer.model.source])


def _stream_error(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name} {exc.details()}"
    return f"{type(exc).__name__}: {exc}"
