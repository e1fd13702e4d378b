"""`Assignments`: what the controller assigns, run on the executor, each job answered once.

An assignment is accepted (at most `slots` run at once; the controller never sends more),
adopted (a job already running here, offered again by a restarted controller, goes on under
the new assignment), re-addressed (a job whose result still waits to be sent goes out under the
new assignment instead of a second run) or refused at once: while draining (UNAVAILABLE), for a
model outside `--models` or of another execution mode (FAILED_PRECONDITION). Each job's events
go up the stream while it is connected; its one result goes into the `Outbox` as durable
(`result_message`: a result over the stream's message limit becomes an error), and is counted
(`succeeded`, `failed`: what the heartbeats report).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from omnirt import types as t
from omnirt._internal.limits import MAX_MESSAGE_BYTES
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol.messages import Assignment, AssignmentEvent, AssignmentResult, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.worker import redact
from omnirt.worker.artifact_store import ArtifactUploader
from omnirt.worker.config import WorkerConfig
from omnirt.worker.connection import Outbox
from omnirt.worker.failures import CANCELLED
from omnirt.worker.modes.events import trace_id
from omnirt.worker.modes.executor import CancelFlags, Executor
from omnirt.worker.telemetry import job_context

log = logging.getLogger(__name__)


def model_refusal(config: WorkerConfig, spec: t.ModelSpec) -> t.JobError | None:
    """Why this worker does not run `spec` (its execution mode, `--models`), or None."""
    if spec.execution_mode and spec.execution_mode != config.mode:
        return t.JobError(
            "FAILED_PRECONDITION",
            f"model {spec.id!r} needs execution mode {spec.execution_mode!r}; worker {config.worker_id} "
            f"runs {config.mode!r}",
        )
    if config.models and spec.id not in config.models:
        return t.JobError(
            "FAILED_PRECONDITION", f"worker {config.worker_id} does not serve model {spec.id!r}"
        )
    return None


def thread_pool(slots: int) -> ThreadPoolExecutor:
    """The loop's default thread pool: room for a pipeline thread per slot and for model loads.

    asyncio's own default has min(32, CPUs + 4) threads: fewer than the slots of a busy worker
    on a small machine, so jobs the controller counts as running would wait for a thread.
    """
    default = min(32, (os.cpu_count() or 1) + 4)
    return ThreadPoolExecutor(max_workers=max(default, slots + 4), thread_name_prefix="omnirt-run")


def result_message(assignment_id: str, outcome: ItemOutcome) -> gateway_pb2.ConnectRequest:
    """The stream message of one job's result; one that cannot be encoded, or is over the
    stream's message limit, becomes an error that still ends the job."""
    try:
        msg = wire.to_controller(AssignmentResult(assignment_id, outcome))
        size = msg.ByteSize()
    except Exception as exc:
        log.exception("cannot encode the result of job %s", outcome.job_id)
        error = t.JobError("INTERNAL", f"the worker cannot encode the result: {type(exc).__name__}: {exc}")
        msg = wire.to_controller(AssignmentResult(assignment_id, ItemOutcome(outcome.job_id, error=error)))
        size = 0
    if size > MAX_MESSAGE_BYTES:
        error = t.JobError(
            "RESOURCE_EXHAUSTED",
            f"the result is {size} bytes, over the {MAX_MESSAGE_BYTES}-byte stream message limit",
        )
        msg = wire.to_controller(AssignmentResult(assignment_id, ItemOutcome(outcome.job_id, error=error)))
    return msg


class Assignments:
    """The assignments running here: accept, run on the executor, answer, stop.

    `executor` gives the worker's executor; `connected` says whether a stream is up (events
    are only worth sending live); `finished(assignment, outcomes, started_ns, ended_ns)`
    records each finished assignment (the telemetry); `uploader`,
    when set, puts outputs in the artifact store before the result goes.
    """

    def __init__(
        self,
        config: WorkerConfig,
        executor: Callable[[], Executor],
        outbox: Outbox,
        connected: Callable[[], bool],
        finished: Callable[[Assignment, list[ItemOutcome], int, int], None],
        uploader: ArtifactUploader | None,
    ) -> None:
        self._config = config
        self._executor = executor
        self._outbox = outbox
        self._connected = connected
        self._finished = finished
        self._uploader = uploader
        self._flags = CancelFlags()
        self._slots = asyncio.Semaphore(config.slots)
        # Jobs that join a running step batch take rows of it, not a slot (at most its rows).
        self._rows = asyncio.Semaphore(config.step_rows if config.step_engine else 0)
        self._busy = 0
        # job id -> the assignment its result goes out under (the latest that offered it)
        self._active: dict[str, str] = {}
        # Assignment tasks -> their model (an unload waits for the model's jobs).
        self._task_models: dict[asyncio.Task[None], str] = {}
        # Jobs run here to an end since the process started (see `_answer`).
        self.succeeded = 0
        self.failed = 0

    @property
    def busy(self) -> int:
        """Jobs running now (a batched assignment counts each of its jobs, as the controller does)."""
        return self._busy

    @property
    def running(self) -> dict[str, str]:
        """Job id -> the assignment it runs under, for each job running here (a copy)."""
        return dict(self._active)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The tasks of the assignments running here."""
        return list(self._task_models)

    def running_of(self, model_id: str) -> list[asyncio.Task[None]]:
        """The tasks running `model_id` now."""
        return [task for task, model in self._task_models.items() if model == model_id]

    def accept(self, assignment: Assignment, draining: bool) -> None:
        """Run `assignment` (what is not already done or running here), or refuse it at once."""
        waiting = {item.job_id: self._outbox.waiting_result(item.job_id) for item in assignment.items}
        done = {job_id: result for job_id, result in waiting.items() if result is not None}
        if done:
            # Finished while its result waits for a stream (the controller that assigned it
            # crashed): the result goes out under the new assignment instead of a second run.
            log.info("re-addressing %d finished job(s) to %s", len(done), assignment.assignment_id)
            for result in done.values():
                result.result.assignment_id = assignment.assignment_id
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
        refusal = self._refusal(assignment, draining)
        if refusal is not None:
            log.warning("refusing assignment %s: %s", assignment.assignment_id, refusal.message)
            for job_id in assignment.job_ids:  # not kept findable: judged again if offered again
                outcome = ItemOutcome(job_id, error=refusal)
                self._outbox.put(result_message(assignment.assignment_id, outcome), durable=True)
            return
        for job_id in assignment.job_ids:
            self._active[job_id] = assignment.assignment_id
        task = asyncio.create_task(self._run(assignment))
        self._task_models[task] = assignment.model.id
        task.add_done_callback(self._task_models.pop)

    def cancel(self, job_id: str, reason: str) -> None:
        """The controller's CancelAssignment: the job stops at its next step."""
        if job_id in self._active:
            log.info("job %s: stop requested (%s)", job_id, reason)
            self._flags.request(job_id, reason)
        else:
            log.debug("cancel for job %s, which is not running here", job_id)

    def stop_all(self, code: str) -> None:
        """Stop every running job at its next step; its result is a JobError with `code`."""
        for job_id in list(self._active):
            self._flags.request(job_id, code)

    def _refusal(self, assignment: Assignment, draining: bool) -> t.JobError | None:
        if draining:
            return t.JobError("UNAVAILABLE", f"worker {self._config.worker_id} is draining")
        return model_refusal(self._config, assignment.model)

    async def _run(self, assignment: Assignment) -> None:
        with job_context(assignment.job_ids, assignment.assignment_id, trace_id(assignment.trace_context)):
            async with self._rows if assignment.joins_batch and self._config.step_engine else self._slots:
                started_ns = time.time_ns()
                self._busy += len(assignment.items)
                log.debug("running %d job(s) of model %s", len(assignment.items), assignment.model.id)
                emit = functools.partial(self._emit, assignment.assignment_id)
                try:
                    outcomes = await self._executor().run(assignment, emit, self._flags)
                except Exception as exc:  # an executor bug costs these jobs, never the worker
                    log.exception("executor failed")
                    error = t.JobError("INTERNAL", f"worker error: {type(exc).__name__}: {exc}")
                    outcomes = [ItemOutcome(job_id, error=error) for job_id in assignment.job_ids]
                finally:
                    self._busy -= len(assignment.items)
            self._finished(assignment, outcomes, started_ns, time.time_ns())
            by_job = {outcome.job_id: outcome for outcome in outcomes}
            for job_id in assignment.job_ids:
                outcome = by_job.get(job_id) or ItemOutcome(
                    job_id, error=t.JobError("INTERNAL", "the executor returned no outcome for this job")
                )
                await self._answer(assignment, outcome)

    async def _answer(self, assignment: Assignment, outcome: ItemOutcome) -> None:
        job_id = outcome.job_id
        # Each run's end counts once (an adopted job under its last assignment, a re-addressed
        # result not again). A cancel is the client's choice, not a failure: neither; a refusal
        # never gets here (the job did not run). A job the drain timeout stopped failed here.
        if outcome.error is None:
            self.succeeded += 1
        elif outcome.error.code != CANCELLED:
            self.failed += 1
        if outcome.error is not None:
            log.info("job %s failed: %s %s", job_id, outcome.error.code, outcome.error.message)
            # Whatever mode produced it (persistent ranks, a new executor), the client sees no
            # folder of this worker's; the log above keeps the full text.
            outcome.error = redact.public_error(
                outcome.error, {self._config.model_dir: "MODEL_DIR"}, keep=[assignment.model.source]
            )
        else:
            log.debug("job %s succeeded", job_id)
            if self._uploader is not None and outcome.result is not None:
                await self._uploader.offload(job_id, outcome.result)
        assignment_id = self._active.get(job_id, assignment.assignment_id)  # it may have been adopted
        # A run's result stays findable while it waits (a refusal is judged again if offered again).
        self._outbox.put(result_message(assignment_id, outcome), durable=True, job_id=job_id)
        self._flags.clear(job_id)
        self._active.pop(job_id, None)

    def _emit(self, assignment_id: str, event: t.JobEvent) -> None:
        # Events only matter live; while disconnected they are dropped (results are not).
        # State events stay here: the controller owns job states and ignores them.
        if self._connected() and event.kind is not t.EventKind.STATE:
            assignment_id = self._active.get(event.job_id, assignment_id)  # it may have been adopted
            self._outbox.put(wire.to_controller(AssignmentEvent(assignment_id, event)))
