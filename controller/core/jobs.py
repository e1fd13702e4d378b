"""A job record (the job, its plan, its event log, waiting for new events) and the job rules
both engines share: a new job, an idempotency fingerprint, a worker's result taken as the
controller's and the client's view of it, how a job ends, and the jobs a worker's heartbeat
shows it does not hold."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime

from omnirt._internal.defaults import planned_steps
from omnirt.controller.core.bounds import BACKEND_FIELD
from omnirt.controller.core.router import WorkerHandle, same_process
from omnirt.controller.core.validation import Plan
from omnirt.errors import FailedPrecondition, InvalidRequest
from omnirt.types import (
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    ModelSpec,
    Progress,
    WorkerState,
)

log = logging.getLogger("omnirt.controller")


def utcnow() -> datetime:
    return datetime.now(UTC)


def request_fingerprint(request: GenerateRequest) -> bytes:
    """What makes two submissions 'the same request' for an idempotency key (deadlines aside)."""
    data = asdict(request)
    for name in ("deadline_ms", "timeout_ms"):
        data.pop(name)
    return hashlib.sha256(repr(sorted(data.items())).encode()).digest()


def new_job(plan: Plan, call_deadline_ms: int = 0, tenant: str = "") -> Job:
    """A QUEUED job of `tenant` for a validated request; the request gets the job's effective
    deadline."""
    req = plan.request
    deadlines = [req.deadline_ms, call_deadline_ms]
    # Validation bounds timeout_ms (a year at most): the sum stays far inside the int64 field.
    if req.timeout_ms:
        deadlines.append(int(time.time() * 1000) + req.timeout_ms)
    job = Job(
        id="job-" + uuid.uuid4().hex[:16],
        state=JobState.QUEUED,
        model=plan.spec.id,
        task=req.task,
        priority=req.priority,
        created_at=utcnow(),
        idempotency_key=req.idempotency_key,
        labels=dict(req.labels),
        deadline_ms=min((d for d in deadlines if d), default=0),
        tenant=tenant,
        webhook=req.webhook,
        # The step total is known before the job runs: clients show "0/20 steps", not "0/?".
        progress=Progress(total_steps=planned_steps(req)) if req.num_inference_steps else None,
    )
    # Workers see one deadline per job: the effective one.
    req.deadline_ms = job.deadline_ms
    return job


def artifact_reference(job_id: str, index: int) -> str:
    """The `omnirt://` URI of an artifact fetched through DownloadArtifact."""
    return f"omnirt://jobs/{job_id}/artifacts/{index}"


def client_view(result: GenerateResult, job_id: str, limit: int) -> GenerateResult:
    """The result with artifacts over `limit` bytes replaced by a download reference."""
    artifacts = []
    for a in result.artifacts:
        a.size_bytes = a.size_bytes or len(a.data)
        if a.size_bytes > limit:
            a = replace(a, data=b"", uri=artifact_reference(job_id, a.index))
        artifacts.append(a)
    return replace(result, artifacts=artifacts)


def accept_result(
    result: GenerateResult, job_id: str, trace_id: str, tenant: str, limit: int
) -> GenerateResult:
    """Take a worker's result as the controller's, in place: the job's id, trace id (the job's
    own, also in a batch; the worker's only when the job has none) and tenant (the controller's
    word, not the worker's). Returns the client's view, artifacts over `limit` bytes cut."""
    result.job_id = job_id
    result.report.trace_id = trace_id or result.report.trace_id
    result.report.tenant = tenant
    return client_view(result, job_id, limit)


def end_state(error: JobError) -> JobState:
    """The final state a worker's error ends its job in (a job it stopped at a cancel: CANCELLED)."""
    return JobState.CANCELLED if error.code == "CANCELLED" else JobState.FAILED


def result_with(job_id: str, state: JobState, result: GenerateResult | None, index: int) -> GenerateResult:
    """A job's result, once artifact `index` is known to be in it (DownloadArtifact):
    FailedPrecondition for a job without a result, InvalidRequest past its last artifact."""
    if result is None:
        raise FailedPrecondition(f"job {job_id} has no result (state {state.value})")
    if not 0 <= index < len(result.artifacts):
        raise InvalidRequest(
            f"index: job {job_id} has {len(result.artifacts)} artifacts (got {index})", field="index"
        )
    return result


def log_finished(job_id: str, tenant: str, state: JobState, error: JobError | None) -> None:
    """The log line of a job that reached its final state (on the controller that saw it end)."""
    extra = {
        "job_id": job_id,
        "tenant": tenant,
        "state": state.value,
        "error": error.message if error else "",
    }
    log.info("job finished", extra=extra)


def waiting_reason(spec: ModelSpec, serving: int, unserved: Unserved | None = None, backend: str = "") -> str:
    """Why a queued job of `spec` (pinned to `backend`, if any) waits, given how many workers
    (of that backend) serve the model."""
    of = f" of backend {backend}" if backend else ""
    if serving == 0:
        reason = f"no connected worker{of} serves model {spec.id} (execution mode {spec.execution_mode})"
        return reason + (unserved.note(spec.id) if unserved else "")
    return f"waiting for a free slot on {serving} worker(s){of} serving {spec.id}"


class Unserved:
    """The rule for jobs of a model no connected worker serves (docs/controller.md, "Jobs no
    worker serves"): with `wait_s` > 0 such a job fails FAILED_PRECONDITION once it has waited
    `wait_s` while its model had no worker; 0 refuses it at submit; < 0 lets it wait (its own
    timeout still applies). Models in `expected` (the ones a deployment's pools serve, which may
    scale from zero; `*` = all) always wait. Each engine keeps one and `observe`s its models."""

    def __init__(self, wait_s: float, expected: Sequence[str] = ()) -> None:
        self.wait_s = wait_s
        self.expected = frozenset(expected)
        self._since: dict[str, float] = {}  # model -> when it was first seen without a worker

    def applies(self, model: str) -> bool:
        return self.wait_s >= 0 and "*" not in self.expected and model not in self.expected

    def check_submit(self, spec: ModelSpec, serving: int, backend: str = "") -> None:
        """FailedPrecondition (field `model`, or the backend label for a job pinned to `backend`)
        when the controller refuses jobs no worker serves."""
        if serving == 0 and self.wait_s == 0 and self.applies(spec.id):
            field_name, of = _unserved_field(backend)
            raise FailedPrecondition(
                f"{field_name}: no connected worker{of} serves model {spec.id} (execution mode "
                f"{spec.execution_mode}); {_start_one(spec.id, backend)}",
                field=field_name,
            )

    def observe(self, model: str, serving: int, now: float) -> float:
        """Seconds `model` has been without a worker as of `now` (monotonic), 0 while served."""
        if serving:
            self._since.pop(model, None)
            return 0.0
        return now - self._since.setdefault(model, now)

    def keep_only(self, models: Collection[str]) -> None:
        """Forget the models not in `models` (no job waits for them any more)."""
        for model in [m for m in self._since if m not in models]:
            del self._since[model]

    def error(self, model: str, waited_s: float, unserved_s: float, backend: str = "") -> JobError | None:
        """The error a queued job of `model` (pinned to `backend`, if any) ends with, having waited
        `waited_s` while the model was unserved (on that backend) for `unserved_s`; None while it
        may wait on."""
        if self.wait_s <= 0 or not self.applies(model) or min(waited_s, unserved_s) < self.wait_s:
            return None
        field_name, of = _unserved_field(backend)
        return JobError(
            "FAILED_PRECONDITION",
            f"{field_name}: no connected worker{of} served model {model} for {self.wait_s:g} s (the "
            f"controller's --unserved-wait-s); {_start_one(model, backend)}",
            field=field_name,
        )

    def note(self, model: str) -> str:
        """What a waiting job's reason adds: when it will fail, if it will."""
        if self.wait_s <= 0 or not self.applies(model):
            return ""
        return f"; the job fails after {self.wait_s:g} s without one (--unserved-wait-s)"


def _unserved_field(backend: str) -> tuple[str, str]:
    """The field an unserved job's error names, and the words that say which workers it lacks."""
    if backend:
        return BACKEND_FIELD, f" of backend {backend}"
    return "model", ""


def _start_one(model: str, backend: str) -> str:
    on = f" --backend {backend}" if backend else ""
    return f"start a worker that serves it (omnirt-worker --models {model}{on})"


# The reason a worker's stream ends when its controller shuts down and tells it to reconnect.
RECONNECT_REASON = "the controller is shutting down; the worker reconnects"


def log_worker_gone(handle: WorkerHandle, reason: str) -> None:
    """The log line of a worker whose stream ended: INFO for a worker that drained (it finished
    its jobs and left) or was told to reconnect by a controller shutting down, WARNING else."""
    extra = {"worker_id": handle.id, "reason": reason}
    if handle.info.state is WorkerState.DRAINING and not handle.running:
        log.info("worker drained", extra=extra)
    elif reason == RECONNECT_REASON:
        log.info("worker told to reconnect", extra=extra)
    else:
        log.warning("worker lost", extra=extra)


async def worker_joined(
    handle: WorkerHandle,
    old: WorkerHandle | None,
    lose_jobs: Callable[[WorkerHandle, str], Awaitable[None]],
) -> None:
    """A worker's stream was registered as `handle`, in the place of `old` (the same id) if any.

    The old stream is closed. Its jobs still run when it was the same process (the new handle
    holds them, and gets what the old one had not written); another process, come after the
    old one's lease expired, never ran them: the engine's `lose_jobs(old, reason)` requeues them.
    """
    if old is not None:
        old.link.close()
        if same_process(old.info, handle.info):
            handle.take_over(old)
        else:
            await lose_jobs(old, f"worker {old.id} was replaced by a new process")
    log.info("worker connected", extra={"worker_id": handle.id, "mode": handle.info.execution_mode})
    for warning in handle.warnings:
        log.warning("worker %s: %s", handle.id, warning, extra={"worker_id": handle.id})


async def requeue_unheld(
    handle: WorkerHandle,
    listed: set[tuple[str, str]] | None,
    requeue: Callable[[str, str, str], Awaitable[None]],
) -> bool:
    """Reconcile what runs on a worker with the (job id, assignment id) pairs its heartbeat
    lists (None: a worker that does not list them, nothing is reconciled).

    A job counted on `handle` that the worker does not hold (a lost result, an assignment it
    never ran; `WorkerHandle.unlisted` gives the grace) frees its slot, and the engine's
    `requeue(job_id, assignment_id, message)` puts it back in the queue as if its worker was
    lost. Returns whether a slot was freed (the engine's dispatcher has work then).
    """
    if listed is None:
        return False
    unheld = handle.unlisted(listed)
    for job_id, assignment_id in unheld:
        handle.release(job_id, assignment_id)
        log.warning("job not held by its worker: released", extra={"job_id": job_id, "worker_id": handle.id})
        await requeue(
            job_id, assignment_id, f"worker {handle.id} does not hold the job (its heartbeat leaves it out)"
        )
    return bool(unheld)


@dataclass
class JobRecord:
    """A job with what the controller needs to run it: the plan, the event log, the full result."""

    job: Job
    plan: Plan
    fingerprint: bytes = b""
    events: list[JobEvent] = field(default_factory=list)
    # `plan.request` encoded (omnirt.v1.GenerateRequest) by the store, once: every attempt's
    # assignment and the frozen job carry these bytes.
    request_encoded: bytes = b""
    # The result with every artifact's bytes; `job.result` is the same minus oversized bytes.
    result: GenerateResult | None = None
    # `result` encoded (omnirt.v1.GenerateResult) as the worker sent it, when it is that (the
    # memory store's, see `core.encoded`): freezing keeps these bytes instead of converting the
    # result back.
    result_encoded: bytes | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    # Kept across requeues, so a retried job keeps its place (and its aging).
    first_enqueued_at: float = field(default_factory=time.monotonic)
    # Fair share's start tag (monotonic s, see tenants.py); 0 for the tenant "" (FIFO as before).
    start_s: float = 0.0
    assignment_id: str = ""
    # When the current attempt was sent to a worker (monotonic) and with how many jobs in all:
    # the run-time estimate fair share charges learns from it.
    dispatched_at: float = 0.0
    batch_size: int = 1
    finished_at_monotonic: float = 0.0
    # Made only when someone waits (most jobs have no watcher: the hot path skips the churn).
    _changed: asyncio.Event | None = None
    _final: asyncio.Event | None = None

    # The names a `frozen.FinishedJob` has too: the store filters and evicts either kind.
    @property
    def state(self) -> JobState:
        return self.job.state

    @property
    def model(self) -> str:
        return self.job.model

    @property
    def tenant(self) -> str:
        return self.job.tenant

    @property
    def idempotency_key(self) -> str:
        return self.job.idempotency_key

    def append(self, event: JobEvent) -> JobEvent:
        """Number the event, log it and wake the watchers."""
        event.sequence = len(self.events) + 1
        event.job_id = self.job.id
        event.time = event.time or utcnow()
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self._final is not None and self.job.state.terminal:
            self._final.set()
        return event

    async def wait_after(self, sequence: int, timeout: float | None = None) -> list[JobEvent]:
        """Events after `sequence`, waiting for at least one unless the job is already final."""
        if len(self.events) <= sequence and not self.job.state.terminal:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when the
            # caller is cancelled in the loop turn the event is set, so a client that went away
            # (its call cancelled) would go on being served, and its job never abandoned.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await changed.wait()
        return self.events[sequence:]

    async def wait_final(self) -> None:
        """Until the job is in a final state (woken once, not on every progress event)."""
        if self.job.state.terminal:
            return
        if self._final is None:
            self._final = asyncio.Event()
        await self._final.wait()
