"""`WorkerDaemon`: one stream to the controller, assignments run on the executor.

The worker dials `WorkerGatewayService.Connect`, sends Hello, waits for Welcome, then sends a
Heartbeat every interval while it runs what the controller assigns (at most `slots` at
once), streaming AssignmentEvents and one AssignmentResult per job. When the stream fails it
reconnects with exponential backoff and jitter, says Hello again with the same worker id and
then sends the results that finished while it was away. A drain (SIGTERM, SIGINT or the
controller's Drain) announces `draining`, takes nothing new, lets running jobs finish within
`drain_timeout_s`, flushes results, closes the stream and ends `run()`.

Preload (`--preload`, on by default for persistent_worker): after the first Welcome the worker
asks the controller's ModelService (DescribeModel, over the same channel) for the catalog
entry of each of its `--models` and has the executor make it warm, in the background: jobs
are taken meanwhile (a job for a model still loading waits for it and is reported cold), and
`loaded_models` names a model only once it is warm.

Realtime sessions (`--session-slots`, docs/worker.md): a SessionOffer on Connect starts a
`SessionHost` task, which dials its own WorkerSession stream on the same channel. An offer the
worker cannot take (every session slot busy, draining, a model it does not serve) is still
attached and answered with `error` at once, so the controller does not wait for a timeout.
Sessions count as running for a drain: they go on until `drain_timeout_s`, then are closed
with `closed` reason "worker_draining".

Admission (`worker/credentials.py`): the stream carries the worker's token (`--token-file`),
over TLS when asked (`--tls-ca`, `--tls`, a client certificate with `--tls-cert`). A
controller that refuses the worker (UNAUTHENTICATED, PERMISSION_DENIED) is not retried: a
wrong token does not fix itself, so `run()` ends with exit code 2 (an orchestrator restarts
the worker with the new secret). A controller not reached, TLS failures included, is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

import omnirt
from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.limits import MAX_MESSAGE_BYTES, STREAM_BATCH_MAX_BYTES, STREAM_BATCH_MAX_MESSAGES
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol import tolerant
from omnirt._internal.protocol.messages import (
    Assignment,
    AssignmentEvent,
    AssignmentResult,
    CancelAssignment,
    ControllerMessage,
    Drain,
    Heartbeat,
    Hello,
    ItemOutcome,
    LoadModel,
    SessionOffer,
    UnloadModel,
    Welcome,
)
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, models_pb2_grpc
from omnirt.worker import redact
from omnirt.worker.artifact_store import ArtifactUploader
from omnirt.worker.config import WorkerConfig
from omnirt.worker.credentials import WorkerCredentials
from omnirt.worker.log import job_context
from omnirt.worker.model_requests import ModelRequests
from omnirt.worker.modes.base import CancelFlags, Executor, create_executor
from omnirt.worker.modes.report import trace_id
from omnirt.worker.outbox import Outbox
from omnirt.worker.runtime.memory import current_rss_bytes
from omnirt.worker.sessions.host import SessionHost
from omnirt.worker.telemetry import WorkerTelemetry

log = logging.getLogger(__name__)

# grpc-stubs do not know grpc.aio.EOF, the sentinel read() returns at the end of a stream.
STREAM_END: Any = grpc.aio.EOF  # type: ignore[attr-defined]
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
WELCOME_TIMEOUT_S = 10.0
DEFAULT_HEARTBEAT_S = 5.0
BACKOFF_BASE_S = 0.2
# A session shorter than this does not reset the backoff (a controller that keeps closing
# the stream right after Welcome must not be hammered).
STABLE_SESSION_S = 10.0
# After drain_timeout_s: time for stopped jobs to answer and for results to be flushed.
DRAIN_GRACE_S = 10.0
# The JobError code of jobs stopped because the drain timed out: retryable elsewhere.
DRAIN_STOP_CODE = "UNAVAILABLE"
# The `closed` reason of sessions still open when the drain timed out.
DRAIN_SESSION_REASON = "worker_draining"
DESCRIBE_TIMEOUT_S = 10.0
# The controller's answers that reconnecting does not change: the worker exits with EXIT_REFUSED.
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
EXIT_REFUSED = 2


def failure_hint(exc: grpc.aio.AioRpcError, tls: bool) -> str:
    """What to check, for a connection failure whose grpc text alone leaves one guessing."""
    details = exc.details() or ""
    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
        return " (this port does not serve the worker stream: use the controller's --worker-listen port)"
    if "Hostname Verification" in details:
        return " (the controller's certificate does not name this address: pass --tls-server-name NAME)"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return " (the controller's certificate is not signed by a CA this worker trusts: check --tls-ca)"
    if "WRONG_VERSION_NUMBER" in details:
        return " (the controller does not serve TLS on this port: drop --tls/--tls-ca, or check the port)"
    if "Socket closed" in details:
        if not tls:
            return " (if the controller serves TLS, pass --tls-ca FILE or --tls)"
        return " (if the controller requires client certificates, pass --tls-cert and --tls-key)"
    return ""


def backoff_delay(
    attempt: int, cap_s: float, base_s: float = BACKOFF_BASE_S, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before reconnect `attempt` (0-based): exponential, capped, "equal jitter"."""
    ceiling = min(cap_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + rand() * ceiling / 2


def thread_pool(slots: int) -> ThreadPoolExecutor:
    """The loop's default thread pool: room for a pipeline thread per slot and for model loads.

    asyncio's own default has min(32, CPUs + 4) threads: fewer than the slots of a busy worker
    on a small machine, so jobs the controller counts as running would wait for a thread.
    """
    default = min(32, (os.cpu_count() or 1) + 4)
    return ThreadPoolExecutor(max_workers=max(default, slots + 4), thread_name_prefix="omnirt-run")


class WorkerDaemon:
    """The worker process's main object: connection, heartbeats, assignments, drain."""

    def __init__(self, config: WorkerConfig, executor: Executor | None = None) -> None:
        self.config = config
        self._executor = executor
        self._flags = CancelFlags()
        self._outbox = Outbox()
        self._slots = asyncio.Semaphore(config.slots)
        self._tasks: set[asyncio.Task[None]] = set()  # assignments and sessions
        # session id -> its relay, while it runs
        self._sessions: dict[str, SessionHost] = {}
        self._channel: grpc.aio.Channel | None = None  # the Connect stream's, while welcomed
        # job id -> the assignment its result goes out under (the latest that offered it)
        self._active: dict[str, str] = {}
        # job id -> its result while not yet written to a stream (kept across reconnects)
        self._unsent: dict[str, Any] = {}
        # This process's own id: the controller lets a Hello with a connected worker's id in only
        # from the same process (a stream it has not yet noticed is gone), never from another.
        self._instance_id = uuid.uuid4().hex
        self._credentials = WorkerCredentials(config)  # CredentialError (a ValueError): exit 2
        # --artifact-store: outputs go to S3 while the controller uses the same store.
        self._uploader = ArtifactUploader(config) if config.artifact_store else None
        self._exit_code = 0
        self._busy = 0
        self._draining = False
        self._closing = False
        self._drain_reason = ""
        self._drain_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self._call: Any = None
        self._heartbeat_s = DEFAULT_HEARTBEAT_S
        self._welcomed_at: float | None = None
        self._batch_writes = False  # the controller of this session reads batches
        # Preloads by model id: a task while the model is made warm, None once settled.
        self._preloads: dict[str, asyncio.Task[None] | None] = {}
        # Assignment tasks -> their model (an unload waits for the model's jobs).
        self._task_models: dict[asyncio.Task[None], str] = {}
        self._model_requests = ModelRequests(
            lambda: self.executor,
            self._running_of,
            self._model_refusal,
            lambda answer: self._outbox.put(wire.to_controller(answer)),
            self._queue_heartbeat,
            config.model_dir,
        )
        self.telemetry = WorkerTelemetry(
            config.worker_id,
            config.slots,
            lambda: self._busy,
            lambda: self._executor.loaded_models() if self._executor else [],
        )

    # ---- public --------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            self._executor = create_executor(self.config)
        return self._executor

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def connected(self) -> bool:
        return self._call is not None

    @property
    def busy_slots(self) -> int:
        """Jobs running now (a batched assignment counts each of its jobs, as the controller does)."""
        return self._busy

    async def run(self) -> int:
        """Serve until drained; returns the exit code: 0, or EXIT_REFUSED when the controller
        refused this worker. Raises when the executor cannot start."""
        # Executors run pipeline calls with asyncio.to_thread: one thread per busy slot, plus loads.
        # A session pushes in a thread too.
        threads = thread_pool(self.config.slots + self.config.session_slots)
        asyncio.get_running_loop().set_default_executor(threads)
        await self.executor.start()
        # What startup made (torch, diffusers and the rest of the imports) lives as long as the
        # process: kept out of the collector's full passes, which otherwise walk all of it again
        # (models loaded later are not frozen: an evicted one must be collectable).
        gc.collect()
        gc.freeze()
        log.info(
            "worker %s ready: mode=%s backend=%s slots=%d session_slots=%d controller=%s",
            self.worker_id,
            self.config.mode,
            self.executor.backend,
            self.config.slots,
            self.config.session_slots,
            self.config.controller,
        )
        connection = asyncio.create_task(self._connection_loop(), name="omnirt-worker-connection")
        try:
            await self._drain_requested.wait()
            await self._finish_running()
            if not self._exit_code:  # refused: no stream will take the results
                await self._flush()
        finally:
            self._closing = True
            await self._close_stream(connection)
            for task in self._preloads.values():
                if task is not None:
                    task.cancel()
            self._model_requests.cancel()
            await self.executor.close()
        log.info("worker %s stopped", self.worker_id)
        return self._exit_code

    def request_drain(self, reason: str) -> None:
        """Start draining (idempotent); a second request stops running jobs without waiting."""
        if self._draining:
            log.warning("drain requested again (%s): stopping running jobs now", reason)
            self._hurry.set()
            return
        self._draining = True
        self._drain_reason = reason
        log.info("draining (%s): %d assignment(s) or session(s) in progress", reason, len(self._tasks))
        self._queue_heartbeat()
        self._drain_requested.set()

    # ---- drain ---------------------------------------------------------------------------

    async def _wait_tasks(self, timeout: float) -> None:
        """Until no assignment runs, `timeout` passes or a second drain request hurries us."""
        deadline = time.monotonic() + timeout
        hurry = asyncio.create_task(self._hurry.wait())
        try:
            while self._tasks and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                await asyncio.wait(
                    [*self._tasks, hurry], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
        finally:
            hurry.cancel()

    async def _finish_running(self) -> None:
        await self._wait_tasks(self.config.drain_timeout_s)
        if not self._tasks:
            return
        log.warning(
            "drain: stopping %d job(s) and %d session(s) still running",
            len(self._active),
            len(self._sessions),
        )
        for job_id in list(self._active):
            self._flags.request(job_id, DRAIN_STOP_CODE)
        for host in list(self._sessions.values()):
            host.stop(DRAIN_SESSION_REASON)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=DRAIN_GRACE_S)
        if self._tasks:
            log.error("drain: %d assignment(s) did not stop in time; leaving them", len(self._tasks))

    async def _flush(self) -> None:
        if not self._outbox.durable_pending():
            return
        try:
            async with asyncio.timeout(DRAIN_GRACE_S):  # not wait_for, which can swallow a cancel
                await self._outbox.wait_idle()
        except TimeoutError:
            log.warning("drain: %d result(s) could not be sent", self._outbox.durable_pending())

    async def _close_stream(self, connection: asyncio.Task[None]) -> None:
        call = self._call
        if call is not None:
            # Half-close, then let the controller end the stream so buffered results arrive.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await call.done_writing()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5.0):
                    await asyncio.shield(connection)
        connection.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connection

    # ---- connection ----------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        attempt = 0
        warned = False
        while not self._closing:
            self._welcomed_at = None
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REFUSALS:
                    self._refused(exc)
                    return
                failure = f"{exc.code().name} {exc.details()}{failure_hint(exc, self.config.tls)}"
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                failure = "the controller ended the stream"
            if self._closing:
                return
            stable = (
                self._welcomed_at is not None and time.monotonic() - self._welcomed_at >= STABLE_SESSION_S
            )
            attempt = 0 if stable else attempt + 1
            delay = backoff_delay(attempt, self.config.reconnect_max_s)
            # The first failure of an outage is worth a warning; its retries are routine.
            warned = warned and self._welcomed_at is None
            level = logging.INFO if warned else logging.WARNING
            warned = True
            log.log(level, "stream to %s: %s; reconnecting in %.2f s", self.config.controller, failure, delay)
            await asyncio.sleep(delay)

    def _refused(self, exc: grpc.aio.AioRpcError) -> None:
        """The controller will not take this worker: stop now, with EXIT_REFUSED."""
        log.error(
            "controller %s refused this worker: %s %s; not reconnecting (check --token-file or the "
            "client certificate, then restart the worker)",
            self.config.controller,
            exc.code().name,
            exc.details(),
        )
        self._exit_code = EXIT_REFUSED
        self._draining = True
        self._hurry.set()  # jobs still running cannot report to anyone: stop them at once
        self._drain_requested.set()

    async def _session(self) -> None:
        describing: asyncio.Task[None] | None = None
        self._credentials.refresh()  # a rotated token or renewed certificate is used from now on
        async with self._credentials.channel(CHANNEL_OPTIONS) as channel:
            # Raw bytes in: the read loop parses each message itself (tolerant.controller_messages),
            # so one the worker cannot decode fails its own jobs, not the stream and all it runs.
            connect: Any = channel.stream_stream(
                wire.CONNECT_METHOD,
                request_serializer=gateway_pb2.ConnectRequest.SerializeToString,
                response_deserializer=None,
            )
            call = connect(metadata=self._credentials.metadata())
            try:
                await call.write(self._hello())
                async with asyncio.timeout(WELCOME_TIMEOUT_S):
                    first = await call.read()
                if first is STREAM_END:
                    raise ConnectionError("the controller closed the stream before Welcome")
                messages = tolerant.controller_messages(first)
                welcome = self._parse(messages[0]) if messages else None
                if not isinstance(welcome, Welcome):
                    raise ConnectionError(f"expected Welcome, got {type(welcome).__name__}")
                self._on_welcome(welcome)
                self._call = call
                self._channel = channel
                describing = self._start_preloads(channel)
                await self._serve_stream(call)
            finally:
                self._call = None
                self._channel = None  # sessions on it end with it (the controller loses them too)
                if describing is not None:
                    describing.cancel()  # its channel closes with this session; the next one retries
                dropped = self._outbox.drop_live()
                if dropped:
                    log.debug("dropped %d event(s) while disconnected", dropped)
                call.cancel()

    async def _serve_stream(self, call: Any) -> None:
        # Busy slots and draining right away: Hello does not carry them.
        self._queue_heartbeat()
        tasks = [
            asyncio.create_task(self._read_loop(call)),
            asyncio.create_task(self._write_loop(call)),
            asyncio.create_task(self._heartbeat_loop()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _on_welcome(self, welcome: Welcome) -> None:
        self._welcomed_at = time.monotonic()
        self._batch_writes = welcome.accepts_batches
        if welcome.heartbeat_interval_ms:
            self._heartbeat_s = welcome.heartbeat_interval_ms / 1000.0
        if welcome.worker_id and welcome.worker_id != self.worker_id:
            log.warning("controller calls this worker %r; keeping %r", welcome.worker_id, self.worker_id)
        log.info(
            "connected to %s (heartbeat %.1f s, lease %d ms, %d result(s) to resend)",
            self.config.controller,
            self._heartbeat_s,
            welcome.lease_timeout_ms,
            self._outbox.durable_pending(),
        )
        for warning in welcome.warnings:
            log.warning("controller: %s", warning)
        if self._uploader is not None:
            self._uploader.welcomed(welcome.artifact_store)

    async def _read_loop(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is STREAM_END:
                return
            for one in tolerant.controller_messages(msg):
                self._handle(self._parse(one))

    def _parse(self, one: gateway_pb2.ConnectResponse | tolerant.Undecodable) -> ControllerMessage | None:
        """What the controller sent; an assignment that cannot be read is answered with an error."""
        if isinstance(one, tolerant.Undecodable):
            log.error("cannot decode a controller message (assignment %r): %s", one.assignment_id, one.reason)
            self._refuse_raw(
                one.assignment_id, one.job_ids, f"the worker cannot decode the assignment: {one.reason}"
            )
            return None
        try:
            return wire.from_controller(one)
        except Exception as exc:
            log.exception("cannot read a controller message")
            assignment_id, job_ids = tolerant.assignment_job_ids(one)
            self._refuse_raw(assignment_id, job_ids, f"the worker cannot read the assignment: {exc}")
            return None

    async def _write_loop(self, call: Any) -> None:
        while True:
            # Messages queued while a write is in flight go up together as one batch (when the
            # controller reads batches).
            limit = STREAM_BATCH_MAX_MESSAGES if self._batch_writes else 1
            items = await self._outbox.get_many(
                limit, STREAM_BATCH_MAX_BYTES, gateway_pb2.ConnectRequest.ByteSize
            )
            if len(items) == 1:
                message = items[0].message
            else:
                message = wire.batch_to_controller([item.message for item in items])
            try:
                await call.write(message)
            except BaseException:
                for item in reversed(items):  # reversed: kept results go back in their order
                    if not self._outbox.failed(item) and item.durable:
                        log.error("giving up on a result after %d failed writes", item.attempts)
                        self._unsent.pop(item.message.result.job_id, None)
                raise
            for item in items:
                self._outbox.sent(item)
                if item.durable:  # a result
                    self._unsent.pop(item.message.result.job_id, None)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            self._queue_heartbeat()

    def _hello(self) -> gateway_pb2.ConnectRequest:
        hello = Hello(
            worker_id=self.worker_id,
            execution_mode=self.config.mode,
            backend=self.executor.backend,
            models=list(self.config.models),
            slots=self.config.slots,
            loaded_models=self.executor.loaded_models(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=omnirt.__version__,
            instance_id=self._instance_id,
            session_slots=self.config.session_slots,
        )
        return wire.to_controller(hello)

    def _queue_heartbeat(self) -> None:
        if self._call is None or self._closing:
            return
        beat = Heartbeat(
            busy_slots=self._busy,
            loaded_models=self.executor.loaded_models(),
            memory_bytes=current_rss_bytes(),
            draining=self._draining,
            running=dict(self._active),
            sessions=list(self._sessions),
            model_bytes=self.executor.model_memory(),
        )
        self._outbox.put(wire.to_controller(beat))

    # ---- preload -------------------------------------------------------------------------

    def _start_preloads(self, channel: grpc.aio.Channel) -> asyncio.Task[None] | None:
        """Preload the `--models` not preloaded yet (after each Welcome until all are settled)."""
        if not self.config.preload or self._draining:
            return None
        pending = [m for m in self.config.models if m not in self._preloads]
        if not pending:
            return None
        return asyncio.create_task(self._describe_and_preload(channel, pending), name="omnirt-preload")

    async def _describe_and_preload(self, channel: grpc.aio.Channel, model_ids: list[str]) -> None:
        stub = models_pb2_grpc.ModelServiceStub(channel)
        for model_id in model_ids:
            request = models_pb2.DescribeModelRequest(model=model_id)
            try:
                # With the worker's token: a controller with API keys lets an admitted worker
                # read its catalog (controller/edges/auth_interceptor.py, CATALOG_SERVICE).
                response = await stub.DescribeModel(
                    request, timeout=DESCRIBE_TIMEOUT_S, metadata=self._credentials.metadata()
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    log.warning("preload: the controller has no model %r (%s)", model_id, exc.details())
                    self._preloads[model_id] = None
                elif exc.code() in REFUSALS:
                    # The catalog refuses this worker (no token: admitted by certificate, or an
                    # older controller): the model loads at its first job instead (asked again at
                    # each session, it would fail the same way and fill the audit log).
                    log.warning(
                        "preload: the controller does not describe model %r to this worker (%s); "
                        "it loads at its first job",
                        model_id,
                        exc.code().name,
                    )
                    self._preloads[model_id] = None
                else:  # the controller is away: the next session asks again
                    log.warning("preload: cannot describe model %r: %s", model_id, exc.code().name)
                continue
            spec = _convert.model_from_proto(response.model)
            if spec.execution_mode and spec.execution_mode != self.config.mode:
                log.warning(
                    "preload: model %r runs in mode %r, not %r; not preloaded",
                    model_id,
                    spec.execution_mode,
                    self.config.mode,
                )
                self._preloads[model_id] = None
                continue
            self._preloads[model_id] = asyncio.create_task(
                self._preload(spec), name=f"omnirt-preload-{model_id}"
            )

    async def _preload(self, spec: t.ModelSpec) -> None:
        started = time.monotonic()
        log.info("preloading model %s", spec.id)
        try:
            await self.executor.preload(spec)
        except NotImplementedError as exc:
            log.warning("--preload: %s", exc)
        except Exception as exc:  # its first job tries again (and reports why it cannot)
            log.error("preload of model %s failed: %s: %s", spec.id, type(exc).__name__, exc)
        else:
            log.info("model %s preloaded in %.1f s", spec.id, time.monotonic() - started)
            self._queue_heartbeat()  # the controller learns it is warm now, not a beat later
        finally:
            self._preloads[spec.id] = None

    # ---- controller messages -------------------------------------------------------------

    def _handle(self, msg: ControllerMessage | None) -> None:
        if isinstance(msg, Assignment):
            self._accept(msg)
        elif isinstance(msg, CancelAssignment):
            if msg.job_id in self._active:
                log.info("job %s: stop requested (%s)", msg.job_id, msg.reason or "CANCELLED")
                self._flags.request(msg.job_id, msg.reason or "CANCELLED")
            else:
                log.debug("cancel for job %s, which is not running here", msg.job_id)
        elif isinstance(msg, Drain):
            self.request_drain(f"controller: {msg.reason}" if msg.reason else "controller")
        elif isinstance(msg, SessionOffer):
            self._offer_session(msg)
        elif isinstance(msg, (LoadModel, UnloadModel)):
            self._model_requests.handle(msg, self._draining)
        elif isinstance(msg, Welcome):
            self._on_welcome(msg)
        else:
            log.debug("ignoring a controller message this worker does not know")

    def _refusal(self, assignment: Assignment) -> t.JobError | None:
        if self._draining:
            return t.JobError("UNAVAILABLE", f"worker {self.worker_id} is draining")
        return self._model_refusal(assignment.model)

    def _model_refusal(self, spec: t.ModelSpec) -> t.JobError | None:
        """Why this worker does not run `spec` (its execution mode, `--models`), or None."""
        if spec.execution_mode and spec.execution_mode != self.config.mode:
            return t.JobError(
                "FAILED_PRECONDITION",
                f"model {spec.id!r} needs execution mode {spec.execution_mode!r}; worker {self.worker_id} "
                f"runs {self.config.mode!r}",
            )
        if self.config.models and spec.id not in self.config.models:
            return t.JobError(
                "FAILED_PRECONDITION", f"worker {self.worker_id} does not serve model {spec.id!r}"
            )
        return None

    def _accept(self, assignment: Assignment) -> None:
        done = [item.job_id for item in assignment.items if item.job_id in self._unsent]
        if done:
            # Finished while its result waits for a stream (the controller that assigned it
            # crashed): the result goes out under the new assignment instead of a second run.
            log.info("re-addressing %d finished job(s) to %s", len(done), assignment.assignment_id)
            for job_id in done:
                self._unsent[job_id].result.assignment_id = assignment.assignment_id
            assignment.items = [item for item in assignment.items if item.job_id not in done]
        duplicates = [item.job_id for item in assignment.items if item.job_id in self._active]
        if duplicates:
            # Offered again (a restarted controller requeued it): the run goes on, also while
            # draining, and its events and result go out under the new assignment, the one the
            # controller now holds it by.
            log.info(
                "adopting %d job(s) already running here into %s", len(duplicates), assignment.assignment_id
            )
            for job_id in duplicates:
                self._active[job_id] = assignment.assignment_id
            assignment.items = [item for item in assignment.items if item.job_id not in duplicates]
        if not assignment.items:
            return
        refusal = self._refusal(assignment)
        if refusal is not None:
            log.warning("refusing assignment %s: %s", assignment.assignment_id, refusal.message)
            for job_id in assignment.job_ids:
                self._send_result(assignment.assignment_id, ItemOutcome(job_id, error=refusal))
            return
        for job_id in assignment.job_ids:
            self._active[job_id] = assignment.assignment_id
        task = asyncio.create_task(self._run_assignment(assignment))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._task_models[task] = assignment.model.id
        task.add_done_callback(self._task_models.pop)

    def _running_of(self, model_id: str) -> list[asyncio.Task[None]]:
        """The tasks running (or preloading) `model_id` now."""
        tasks = [task for task, model in self._task_models.items() if model == model_id]
        preload = self._preloads.get(model_id)
        return [*tasks, preload] if preload is not None else tasks

    def _offer_session(self, offer: SessionOffer) -> None:
        """Host `offer`, or attach and refuse it at once (slots busy, draining, another model)."""
        if offer.session_id in self._sessions:
            log.info("session %s: offered again while hosted here; ignored", offer.session_id)
            return
        refusal = self._session_refusal(offer)
        if refusal is not None:
            log.warning("refusing session %s: %s", offer.session_id, refusal.message)
        host = SessionHost(
            offer,
            self.executor,
            self._channel,
            worker_id=self.worker_id,
            instance_id=self._instance_id,
            token=self._credentials.token,
            metadata=self._credentials.metadata(),
            refusal=refusal,
            model_dir=self.config.model_dir,
            on_release=None if refusal else lambda: self._release_session(host),
        )
        if refusal is None:
            self._sessions[offer.session_id] = host
        task = asyncio.create_task(self._host_session(host), name=f"omnirt-session-{offer.session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if refusal is None:
            self._queue_heartbeat()  # the controller sees the session here at once

    def _session_refusal(self, offer: SessionOffer) -> t.JobError | None:
        if self._draining:
            return t.JobError("UNAVAILABLE", f"worker {self.worker_id} is draining")
        if self.config.session_slots == 0:
            return t.JobError(
                "FAILED_PRECONDITION",
                f"worker {self.worker_id} hosts no realtime sessions (--session-slots 0)",
            )
        if len(self._sessions) >= self.config.session_slots:
            return t.JobError(
                "RESOURCE_EXHAUSTED",
                f"worker {self.worker_id}: all {self.config.session_slots} session slot(s) are busy",
            )
        refusal = self._model_refusal(offer.model)
        if refusal is not None:
            return t.JobError(refusal.code, refusal.message, "model")
        return None

    async def _host_session(self, host: SessionHost) -> None:
        try:
            await host.run()
        except Exception:  # run() answers its own failures; a bug here costs the session alone
            log.exception("session %s failed", host.session_id)
        finally:
            self._release_session(host)

    def _release_session(self, host: SessionHost) -> None:
        """`host`'s slot is free (its model session is closed); idempotent."""
        if self._sessions.get(host.session_id) is host:
            del self._sessions[host.session_id]
            self._queue_heartbeat()

    def _refuse_raw(self, assignment_id: str, job_ids: list[str], reason: str) -> None:
        for job_id in job_ids:
            self._send_result(
                assignment_id, ItemOutcome(job_id, error=t.JobError("INVALID_ARGUMENT", reason))
            )

    # ---- running -------------------------------------------------------------------------

    async def _run_assignment(self, assignment: Assignment) -> None:
        with job_context(assignment.job_ids, assignment.assignment_id, trace_id(assignment.trace_context)):
            async with self._slots:
                started_ns = time.time_ns()
                self._busy += len(assignment.items)
                log.debug("running %d job(s) of model %s", len(assignment.items), assignment.model.id)
                emit = functools.partial(self._emit, assignment.assignment_id)
                try:
                    outcomes = await self.executor.run(assignment, emit, self._flags)
                except Exception as exc:  # an executor bug costs these jobs, never the worker
                    log.exception("executor failed")
                    error = t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
                    outcomes = [ItemOutcome(job_id, error=error) for job_id in assignment.job_ids]
                finally:
                    self._busy -= len(assignment.items)
            self.telemetry.assignment_done(assignment, outcomes, started_ns, time.time_ns())
            by_job = {outcome.job_id: outcome for outcome in outcomes}
            for job_id in assignment.job_ids:
                outcome = by_job.get(job_id) or ItemOutcome(
                    job_id, error=t.JobError("INTERNAL", "the executor returned no outcome for this job")
                )
                if outcome.error is not None:
                    log.info("job %s failed: %s %s", job_id, outcome.error.code, outcome.error.message)
                    # Whatever mode produced it (persistent ranks, a new executor), the client
                    # sees no folder of this worker's; the log above keeps the full text.
                    outcome.error = redact.public_error(
                        outcome.error, {self.config.model_dir: "MODEL_DIR"}, keep=[assignment.model.source]
                    )
                else:
                    log.debug("job %s succeeded", job_id)
                    if self._uploader is not None and outcome.result is not None:
                        await self._uploader.offload(job_id, outcome.result)
                sent = self._send_result(self._active.get(job_id, assignment.assignment_id), outcome)
                self._unsent[job_id] = sent  # a run's result (a refusal is judged again if offered again)
                self._flags.clear(job_id)
                self._active.pop(job_id, None)

    def _emit(self, assignment_id: str, event: t.JobEvent) -> None:
        # Events only matter live; while disconnected they are dropped (results are not).
        # State events stay here: the controller owns job states and ignores them.
        if self._call is not None and event.kind is not t.EventKind.STATE:
            assignment_id = self._active.get(event.job_id, assignment_id)  # it may have been adopted
            self._outbox.put(wire.to_controller(AssignmentEvent(assignment_id, event)))

    def _send_result(self, assignment_id: str, outcome: ItemOutcome) -> Any:
        try:
            msg = wire.to_controller(AssignmentResult(assignment_id, outcome))
            size = msg.ByteSize()
        except Exception as exc:  # a result that cannot be encoded still ends its job
            log.exception("cannot encode the result of job %s", outcome.job_id)
            error = t.JobError(
                "INTERNAL", f"the worker cannot encode the result: {type(exc).__name__}: {exc}"
            )
            msg = wire.to_controller(
                AssignmentResult(assignment_id, ItemOutcome(outcome.job_id, error=error))
            )
            size = 0
        if size > MAX_MESSAGE_BYTES:
            error = t.JobError(
                "RESOURCE_EXHAUSTED",
                f"the result is {size} bytes, over the {MAX_MESSAGE_BYTES}-byte stream message limit",
            )
            msg = wire.to_controller(
                AssignmentResult(assignment_id, ItemOutcome(outcome.job_id, error=error))
            )
        self._outbox.put(msg, durable=True)
        return msg
