"""`WorkerDaemon`: the worker process, wired from its parts; and its drain.

The parts, each in its own module, talk through what the daemon hands them (callables, the
shared `Outbox`), never through the daemon itself:

- `connection.py`, `Connection`: the Connect stream (dial, Hello/Welcome, the read, write and
  heartbeat loops, reconnects with backoff, the controller's refusal);
- `assignments.py`, `Assignments`: accept, adopt or refuse what the controller assigns, run it
  on the executor (at most `slots` at once), send each job's one result;
- `preload.py`, `Preload`: the `--models` described (DescribeModel) and made warm at start;
- `session_slots.py`, `SessionSlots`: the realtime sessions hosted here;
- `model_requests.py`, `ModelRequests`: the controller's LoadModel and UnloadModel.

The daemon says what the worker is (Hello, Heartbeat), routes each controller message to its
part, and drains: a drain (SIGTERM, SIGINT or the controller's Drain) announces `draining`,
takes nothing new, lets running jobs and sessions finish within `drain_timeout_s` (then stops
them: jobs with UNAVAILABLE, sessions `closed` with "worker_draining"), flushes results,
closes the stream and ends `run()`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import time
import uuid

import grpc

import omnirt
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol.messages import (
    Assignment,
    CancelAssignment,
    ControllerMessage,
    Drain,
    Heartbeat,
    Hello,
    LoadModel,
    SessionOffer,
    UnloadModel,
    Welcome,
)
from omnirt.worker.artifact_store import ArtifactUploader
from omnirt.worker.assignments import Assignments, model_refusal, thread_pool
from omnirt.worker.config import WorkerConfig
from omnirt.worker.connection import EXIT_REFUSED, Connection, Outbox
from omnirt.worker.credentials import WorkerCredentials
from omnirt.worker.model_requests import ModelRequests
from omnirt.worker.modes.base import create_executor
from omnirt.worker.modes.executor import Executor
from omnirt.worker.preload import Preload
from omnirt.worker.runtime.backends import current_rss_bytes, worker_device
from omnirt.worker.session_slots import SessionSlots
from omnirt.worker.telemetry import WorkerTelemetry

log = logging.getLogger(__name__)

# After drain_timeout_s: time for stopped jobs to answer and for results to be flushed.
DRAIN_GRACE_S = 10.0
# The JobError code of jobs stopped because the drain timed out: retryable elsewhere.
DRAIN_STOP_CODE = "UNAVAILABLE"
# The `closed` reason of sessions still open when the drain timed out.
DRAIN_SESSION_REASON = "worker_draining"


class WorkerDaemon:
    """The worker process's main object: its parts wired together, and the drain."""

    def __init__(self, config: WorkerConfig, executor: Executor | None = None) -> None:
        self.config = config
        self._executor = executor
        self._outbox = Outbox()
        # This process's own id: the controller lets a Hello with a connected worker's id in only
        # from the same process (a stream it has not yet noticed is gone), never from another.
        self._instance_id = uuid.uuid4().hex
        self._credentials = WorkerCredentials(config)  # CredentialError (a ValueError): exit 2
        # --artifact-store: outputs go to S3 while the controller uses the same store.
        self._uploader = ArtifactUploader(config) if config.artifact_store else None
        self._draining = False
        self._device = ""  # the devices it runs on: known once the executor has started
        self._drain_requested = asyncio.Event()
        self._hurry = asyncio.Event()
        self.telemetry = WorkerTelemetry(
            config.worker_id,
            config.slots,
            lambda: self._assignments.busy,
            lambda: self._executor.loaded_models() if self._executor else [],
            ready=self._not_ready,
        )
        self._connection = Connection(
            config,
            self._credentials,
            self._outbox,
            hello=self._hello,
            heartbeat=self._heartbeat,
            handle=self._handle,
            on_stream=self._stream_opened,
            on_refused=self._refused,
        )
        heartbeat = self._connection.queue_heartbeat
        self._assignments = Assignments(
            config,
            lambda: self.executor,
            self._outbox,
            lambda: self._connection.connected,
            self.telemetry.assignment_done,
            self._uploader,
        )
        self._preload = Preload(config, self._credentials, lambda: self.executor, heartbeat)
        self._sessions = SessionSlots(
            config,
            self._credentials,
            self._instance_id,
            lambda: self.executor,
            lambda: self._connection.channel,
            heartbeat,
        )
        self._model_requests = ModelRequests(
            lambda: self.executor,
            self._running_of,
            lambda spec: model_refusal(config, spec),
            lambda answer: self._outbox.put(wire.to_controller(answer)),
            heartbeat,
            config.model_dir,
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
        return self._connection.connected

    @property
    def busy_slots(self) -> int:
        """Jobs running now (a batched assignment counts each of its jobs, as the controller does)."""
        return self._assignments.busy

    async def run(self) -> int:
        """Serve until drained; returns the exit code: 0, or EXIT_REFUSED when the controller
        refused this worker. Raises when the executor cannot start."""
        # Executors run pipeline calls with asyncio.to_thread: one thread per busy slot, plus loads.
        # A session pushes in a thread too, and so does each job that joined a step batch.
        rows = self.config.step_rows if self.config.step_engine else 0
        threads = thread_pool(self.config.slots + self.config.session_slots + rows)
        asyncio.get_running_loop().set_default_executor(threads)
        await self.executor.start()
        self._device = await asyncio.to_thread(worker_device, self.executor.backend)
        # What startup made (torch, diffusers and the rest of the imports) lives as long as the
        # process: kept out of the collector's full passes, which otherwise walk all of it again
        # (models loaded later are not frozen: an evicted one must be collectable).
        gc.collect()
        gc.freeze()
        log.info(
            "worker %s ready: mode=%s backend=%s device=%s slots=%d session_slots=%d controller=%s",
            self.worker_id,
            self.config.mode,
            self.executor.backend,
            self._device,
            self.config.slots,
            self.config.session_slots,
            self.config.controller,
        )
        self._connection.start()
        try:
            await self._drain_requested.wait()
            await self._finish_running()
            if not self._connection.refused:  # refused: no stream will take the results
                await self._flush()
        finally:
            await self._connection.close()
            self._preload.cancel()
            self._model_requests.cancel()
            await self.executor.close()
        log.info("worker %s stopped", self.worker_id)
        return EXIT_REFUSED if self._connection.refused else 0

    def request_drain(self, reason: str) -> None:
        """Start draining (idempotent); a second request stops running jobs without waiting."""
        if self._draining:
            log.warning("drain requested again (%s): stopping running jobs now", reason)
            self._hurry.set()
            return
        self._draining = True
        log.info("draining (%s): %d assignment(s) or session(s) in progress", reason, len(self._running()))
        self._connection.queue_heartbeat()
        self._drain_requested.set()

    # ---- wiring --------------------------------------------------------------------------

    def _handle(self, msg: ControllerMessage | None) -> None:
        """Route one controller message to the part that owns it."""
        if isinstance(msg, Assignment):
            self._assignments.accept(msg, self._draining)
        elif isinstance(msg, CancelAssignment):
            self._assignments.cancel(msg.job_id, msg.reason or "CANCELLED")
        elif isinstance(msg, Drain):
            self.request_drain(f"controller: {msg.reason}" if msg.reason else "controller")
        elif isinstance(msg, SessionOffer):
            self._sessions.offer(msg, self._draining)
        elif isinstance(msg, (LoadModel, UnloadModel)):
            self._model_requests.handle(msg, self._draining)
        elif isinstance(msg, Welcome):  # the connection took its own settings already
            if self._uploader is not None:
                self._uploader.welcomed(msg.artifact_store)
        else:
            log.debug("ignoring a controller message this worker does not know")

    def _hello(self) -> Hello:
        step_rows, step_pipelines = self.executor.step_engine()
        return Hello(
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
            step_rows=step_rows,
            step_pipelines=step_pipelines,
            device=self._device,
        )

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            busy_slots=self._assignments.busy,
            loaded_models=self.executor.loaded_models(),
            memory_bytes=current_rss_bytes(),
            draining=self._draining,
            running=self._assignments.running,
            sessions=self._sessions.ids,
            model_bytes=self.executor.model_memory(),
            jobs_succeeded=self._assignments.succeeded,
            jobs_failed=self._assignments.failed,
        )

    def _not_ready(self) -> str:
        """Why the worker takes no work now ("" while it does): what /readyz answers. Called from
        the listener's threads: it reads two fields, each set whole by the event loop."""
        if self._draining:
            return "draining"
        if not self._connection.connected:
            return f"no live stream to the controller at {self.config.controller}"
        return ""

    def _stream_opened(self, channel: grpc.aio.Channel) -> asyncio.Task[None] | None:
        return None if self._draining else self._preload.start(channel)

    def _running_of(self, model_id: str) -> list[asyncio.Task[None]]:
        """The tasks running (or preloading) `model_id` now."""
        tasks = self._assignments.running_of(model_id)
        preload = self._preload.loading(model_id)
        return [*tasks, preload] if preload is not None else tasks

    def _running(self) -> list[asyncio.Task[None]]:
        """The assignments and sessions in progress (a drain waits for them)."""
        return [*self._assignments.tasks, *self._sessions.tasks]

    def _refused(self) -> None:
        """The controller will not take this worker: drain now, stopping what runs at once."""
        self._draining = True
        self._hurry.set()  # jobs still running cannot report to anyone: stop them at once
        self._drain_requested.set()

    # ---- drain ---------------------------------------------------------------------------

    async def _wait_tasks(self, timeout: float) -> None:
        """Until nothing runs, `timeout` passes or a second drain request hurries us."""
        deadline = time.monotonic() + timeout
        hurry = asyncio.create_task(self._hurry.wait())
        try:
            while (running := self._running()) and not self._hurry.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                await asyncio.wait([*running, hurry], timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurry.cancel()

    async def _finish_running(self) -> None:
        await self._wait_tasks(self.config.drain_timeout_s)
        if not self._running():
            return
        log.warning(
            "drain: stopping %d job(s) and %d session(s) still running",
            len(self._assignments.running),
            len(self._sessions),
        )
        self._assignments.stop_all(DRAIN_STOP_CODE)
        self._sessions.stop(DRAIN_SESSION_REASON)
        if running := self._running():
            await asyncio.wait(running, timeout=DRAIN_GRACE_S)
        if running := self._running():
            log.error("drain: %d assignment(s) did not stop in time; leaving them", len(running))

    async def _flush(self) -> None:
        if not self._outbox.durable_pending():
            return
        try:
            async with asyncio.timeout(DRAIN_GRACE_S):  # not wait_for, which can swallow a cancel
                await self._outbox.wait_idle()
        except TimeoutError:
            log.warning("drain: %d result(s) could not be sent", self._outbox.durable_pending())
