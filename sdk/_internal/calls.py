"""The SDK's call core: what each client method sends and what it makes of the answers, once.

Every method of `omnirt.Client` and `omnirt.AsyncClient` is a *plan* here: a generator that
builds the request messages, yields each call it needs (`Unary`, `Follow` a server stream,
`Pause`), gets the call's answer (or its typed error) sent back in, and returns the method's
result as `omnirt.types`. A plan does no I/O, so one plan serves both clients, the way
grpcio's sync and aio stubs come from one service description: `run` drives a plan with
blocking calls, `run_async` with awaited ones, and each client only supplies `perform`, the
one step of I/O in its flavour. `watch` is a `Stream` that the clients iterate themselves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from omnirt import errors
from omnirt._internal import catalog_convert
from omnirt._internal import convert as conv
from omnirt._internal.requests import artifact_file_name, build_request, parse_state, parse_task
from omnirt.types import (
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    ModelOutcome,
    ModelSpec,
    SessionInfo,
    Task,
    ValidationResult,
    WorkerInfo,
)
from omnirt.v1 import cluster_pb2, generation_pb2, models_pb2

T = TypeVar("T")

# The client attribute that holds the service's stub (the stubs stay public as these names).
Service = Literal["generation", "models", "cluster"]


@dataclasses.dataclass(frozen=True)
class Unary:
    """One unary call; the plan gets the answer message back."""

    service: Service
    method: str  # the RPC's name on the stub: "Generate"
    request: Any  # the request message
    timeout: float | None = None  # seconds; None: the client's default deadline
    # Safe to send again when the controller could not be reached or was shutting down: reads,
    # cancels, and Submit/Generate with an idempotency key (a second send finds the same job).
    retry: bool = False


@dataclasses.dataclass(frozen=True)
class Stream(Generic[T]):
    """A server-streaming call and what each of its messages means (`parse`)."""

    service: Service
    method: str
    request: Any
    timeout: float | None  # seconds; None: no deadline (a stream's own, not the client's default)
    parse: Callable[[Any], T]


@dataclasses.dataclass(frozen=True)
class Follow:
    """Read `stream`, handing each parsed message to `each`, until `each` answers true or it ends."""

    stream: Stream[Any]
    each: Callable[[Any], object]


@dataclasses.dataclass(frozen=True)
class Pause:
    """Wait `seconds` (time.sleep or asyncio.sleep)."""

    seconds: float


Step = Unary | Follow | Pause
Plan = Generator[Step, Any, T]


RETRIES = 5  # the clients' default: tries after the first, for calls that are safe to repeat
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 2.0  # backoff: doubling from the first, capped, +-20 % jitter


def retry_delay(step: Step, exc: Exception, attempt: int, retries: int) -> float | None:
    """Seconds to wait before sending `step` again after try `attempt` (1, 2, ...) failed; None: give up.

    Only UNAVAILABLE is retried (no connection, or a controller that is shutting down), only for
    steps marked `retry`, and the controller's RetryInfo is a floor.
    """
    if not isinstance(step, Unary) or not step.retry or attempt > retries:
        return None
    if not isinstance(exc, errors.Unavailable):
        return None
    delay = min(RETRY_FIRST_S * 2 ** (attempt - 1), RETRY_MAX_S)
    return max(delay * random.uniform(0.8, 1.2), exc.retry_after_s or 0.0)


def run(plan: Plan[T], perform: Callable[[Step], Any], retries: int = RETRIES) -> T:
    """Drive `plan` with blocking I/O: each step's answer, or the error it raised, goes back in."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value
        attempt = 0
        while True:
            try:
                answer, error = perform(step), None
            except Exception as exc:  # raised at the plan's `yield`, as if the call were written there
                attempt += 1
                delay = retry_delay(step, exc, attempt, retries)
                if delay is not None:
                    time.sleep(delay)
                    continue
                answer, error = None, exc
            break


async def run_async(plan: Plan[T], perform: Callable[[Step], Awaitable[Any]], retries: int = RETRIES) -> T:
    """`run` with awaited I/O (`AsyncClient`)."""
    answer: Any = None
    error: Exception | None = None
    while True:
        try:
            step = plan.send(answer) if error is None else plan.throw(error)
        except StopIteration as done:
            return done.value
        attempt = 0
        while True:
            try:
                answer, error = await perform(step), None
            except Exception as exc:
                attempt += 1
                delay = retry_delay(step, exc, attempt, retries)
                if delay is not None:
                    await asyncio.sleep(delay)
                    continue
                answer, error = None, exc
            break


# ---- results -------------------------------------------------------------------------------


@dataclasses.dataclass
class CancelResult(Job):
    """The job after a cancel request; `cancelled` is False when it had already finished."""

    cancelled: bool = False


class JobFollower:
    """Follows a job's events to its end and turns the end into a result or a typed error."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.last_sequence = 0
        self.state: JobState | None = None
        self.result: GenerateResult | None = None
        self._error: JobError | None = None

    def feed(self, event: JobEvent) -> bool:
        """Take one event; True once the job has reached its end."""
        self.last_sequence = max(self.last_sequence, event.sequence)
        if event.kind is EventKind.RESULT and event.result is not None:
            self.result = event.result
            self.state = JobState.SUCCEEDED
        elif event.kind is EventKind.STATE and event.state is not None:
            self.state = event.state
            # Only the final state's error counts (a requeue after a lost worker carries one too).
            self._error = event.error if event.state.terminal else None
        return self.ended

    @property
    def ended(self) -> bool:
        """True once the events seen say the job has reached its end."""
        return self.state is not None and self.state.terminal

    @property
    def needs_job(self) -> bool:
        """True when the outcome must be read from the job (a success without its result)."""
        return self.state is not JobState.SUCCEEDED or self.result is None

    def outcome(self, job: Job | None = None) -> GenerateResult:
        """The result of a succeeded job; raise the typed error of a failed or cancelled one."""
        if job is not None:
            self.state = job.state
            self.result = job.result or self.result
            self._error = job.error or self._error
        if self.state is JobState.SUCCEEDED and self.result is not None:
            return self.result
        err = self._error
        if err is not None:
            raise errors.error_for(err.code, err.message, field=err.field)
        if self.state is JobState.CANCELLED:
            raise errors.Cancelled(f"job {self.job_id} was cancelled")
        if self.state is JobState.FAILED:
            raise errors.ExecutionFailed(f"job {self.job_id} failed without an error message")
        state = self.state.value if self.state else "unknown"
        raise errors.FailedPrecondition(f"job {self.job_id} is {state} and has no result")


def wait_timed_out(job_id: str, timeout: float) -> errors.DeadlineExceeded:
    """The error a wait that gave up after `timeout` seconds raises (the job itself may still run)."""
    return errors.DeadlineExceeded(f"job {job_id} did not finish within {timeout:g} s (it may still run)")


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a `time.monotonic()` deadline (None: no deadline)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


# Two answers `omnirt._internal.convert` does not read (yet); only the clients need them.


def validation_from_proto(msg: generation_pb2.ValidateResponse) -> ValidationResult:
    """`ValidateResponse` -> `ValidationResult`."""
    return ValidationResult(
        model=msg.model,
        task=conv.task_from_proto(msg.task),  # type: ignore[arg-type]  # a valid plan has a task
        execution_mode=msg.execution_mode,
        config_resolved=conv.integral(conv.dict_from_struct(msg.config_resolved)),
        warnings=list(msg.warnings),
    )


def session_from_proto(msg: cluster_pb2.SessionInfo) -> SessionInfo:
    """`omnirt.v1.SessionInfo` -> `SessionInfo`."""
    return SessionInfo(
        session_id=msg.session_id,
        model=msg.model,
        worker_id=msg.worker_id,
        controller=msg.controller,
        tenant=msg.tenant,
        labels=dict(msg.labels),
        opened_at=msg.opened_at.ToDatetime(tzinfo=UTC) if msg.HasField("opened_at") else None,
    )


# ---- generation ----------------------------------------------------------------------------


def generate(
    request: GenerateRequest | None, timeout: float | None, fields: Mapping[str, Any]
) -> Plan[GenerateResult]:
    """`Client.generate`: one call; a job that ended without a result raises its error."""
    req = build_request(request, **fields)
    message = conv.request_to_proto(req)
    reply = yield Unary("generation", "Generate", message, timeout, retry=bool(req.idempotency_key))
    if reply.HasField("result"):
        return conv.result_from_proto(reply.result)
    job = conv.job_from_proto(reply.job)
    return JobFollower(job.id).outcome(job)


def submit(request: GenerateRequest | None, timeout: float | None, fields: Mapping[str, Any]) -> Plan[Job]:
    """`Client.submit`."""
    req = build_request(request, **fields)
    message = generation_pb2.SubmitRequest(request=conv.request_to_proto(req))
    reply = yield Unary("generation", "Submit", message, timeout, retry=bool(req.idempotency_key))
    return conv.job_from_proto(reply.job)


def validate(
    request: GenerateRequest | None, timeout: float | None, fields: Mapping[str, Any]
) -> Plan[ValidationResult]:
    """`Client.validate`."""
    message = generation_pb2.ValidateRequest(request=conv.request_to_proto(build_request(request, **fields)))
    return validation_from_proto((yield Unary("generation", "Validate", message, timeout, retry=True)))


# ---- jobs ----------------------------------------------------------------------------------


def get_job(job_id: str) -> Plan[Job]:
    """`Client.get_job`."""
    reply = yield Unary("generation", "GetJob", generation_pb2.GetJobRequest(job_id=job_id), retry=True)
    return conv.job_from_proto(reply.job)


def list_jobs(states: Sequence[JobState | str] | None, model: str, limit: int) -> Plan[list[Job]]:
    """`Client.list_jobs`: follows the pages until `limit` jobs (0: all)."""
    wanted = [conv.state_to_proto(parse_state(s)) for s in states or ()]
    jobs: list[Job] = []
    token = ""
    while True:
        size = max(limit - len(jobs), 0)
        message = generation_pb2.ListJobsRequest(states=wanted, model=model, page_size=size, page_token=token)
        reply = yield Unary("generation", "ListJobs", message, retry=True)
        jobs.extend(conv.job_from_proto(j) for j in reply.jobs)
        token = reply.next_page_token
        if not token or not reply.jobs or (limit and len(jobs) >= limit):
            return jobs[:limit] if limit else jobs


def watch(job_id: str, after_sequence: int, timeout: float | None) -> Stream[JobEvent]:
    """`Client.watch`: the job's events."""
    message = generation_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
    return Stream("generation", "WatchJob", message, timeout, lambda r: conv.event_from_proto(r.event))


def cancel(job_id: str) -> Plan[CancelResult]:
    """`Client.cancel`."""
    message = generation_pb2.CancelJobRequest(job_id=job_id)
    reply = yield Unary("generation", "CancelJob", message, retry=True)
    return CancelResult(**vars(conv.job_from_proto(reply.job)), cancelled=reply.cancelled)


def wait(
    job_id: str, timeout: float | None, on_event: Callable[[JobEvent], None] | None
) -> Plan[GenerateResult]:
    """`Client.wait`: watch the job to its end, resuming after the last event if the stream breaks."""
    deadline = None if timeout is None else time.monotonic() + timeout
    follower = JobFollower(job_id)

    def take(event: JobEvent) -> bool:
        if on_event is not None:
            on_event(event)
        return follower.feed(event)

    broken = 0  # watch calls in a row that could not reach a controller
    while True:
        try:
            yield Follow(watch(job_id, follower.last_sequence, remaining(deadline)), take)
        except errors.DeadlineExceeded:
            # Only our own deadline ends the watch call this way; a job's expired deadline
            # arrives as its FAILED state and is raised by `outcome` below.
            if timeout is None:
                raise
            raise wait_timed_out(job_id, timeout) from None
        except errors.Unavailable as exc:
            # The controller went away or is shutting down: resume after the last event, on
            # whichever controller answers next (bounded as the clients' retries).
            broken += 1
            delay = retry_delay(Unary("generation", "WatchJob", None, retry=True), exc, broken, RETRIES)
            if delay is None:
                raise
            yield Pause(delay)
            continue
        broken = 0
        if follower.ended:
            return follower.outcome((yield from get_job(job_id)) if follower.needs_job else None)
        job = yield from get_job(job_id)
        if job.state.terminal:
            return follower.outcome(job)
        # The stream ended early (a controller restart, a proxy): resume after the last event.
        if timeout is not None and time.monotonic() >= (deadline or 0):
            raise wait_timed_out(job_id, timeout)
        yield Pause(0.2)


def download_artifact(job_id: str, index: int, timeout: float | None) -> Plan[bytes]:
    """`Client.download_artifact`: the chunks of the stream, joined."""
    message = generation_pb2.DownloadArtifactRequest(job_id=job_id, index=index)
    chunks: list[bytes] = []
    yield Follow(Stream("generation", "DownloadArtifact", message, timeout, lambda r: r.chunk), chunks.append)
    return b"".join(chunks)


def save(result: GenerateResult, folder: str | os.PathLike[str]) -> Plan[list[Path]]:
    """`Client.save`: each artifact into `folder`, downloading those not inline."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for artifact in result.artifacts:
        data = artifact.data or (yield from download_artifact(result.job_id, artifact.index, None))
        path = target / artifact_file_name(result.job_id, artifact)
        path.write_bytes(data)
        paths.append(path)
    return paths


# ---- catalog and cluster -------------------------------------------------------------------


def list_models(task: Task | str | None) -> Plan[list[ModelSpec]]:
    """`Client.list_models`."""
    message = models_pb2.ListModelsRequest(task=conv.task_to_proto(parse_task(task) if task else None))
    reply = yield Unary("models", "ListModels", message, retry=True)
    return [catalog_convert.model_from_proto(m) for m in reply.models]


def describe_model(name: str) -> Plan[ModelSpec]:
    """`Client.describe_model`."""
    reply = yield Unary("models", "DescribeModel", models_pb2.DescribeModelRequest(model=name), retry=True)
    return catalog_convert.model_from_proto(reply.model)


def load_model(
    model: str, workers: int, worker_ids: Sequence[str], timeout: float | None
) -> Plan[list[ModelOutcome]]:
    """`Client.load_model`."""
    message = models_pb2.LoadModelRequest(model=model, workers=workers, worker_ids=list(worker_ids))
    reply = yield Unary("models", "LoadModel", message, timeout)
    return [catalog_convert.model_outcome_from_proto(o) for o in reply.outcomes]


def unload_model(model: str, worker_ids: Sequence[str], timeout: float | None) -> Plan[list[ModelOutcome]]:
    """`Client.unload_model`."""
    message = models_pb2.UnloadModelRequest(model=model, worker_ids=list(worker_ids))
    reply = yield Unary("models", "UnloadModel", message, timeout)
    return [catalog_convert.model_outcome_from_proto(o) for o in reply.outcomes]


def list_workers() -> Plan[list[WorkerInfo]]:
    """`Client.list_workers`."""
    reply = yield Unary("cluster", "ListWorkers", cluster_pb2.ListWorkersRequest(), retry=True)
    return [catalog_convert.worker_from_proto(w) for w in reply.workers]


def list_sessions(model: str) -> Plan[list[SessionInfo]]:
    """`Client.list_sessions`."""
    reply = yield Unary("cluster", "ListSessions", cluster_pb2.ListSessionsRequest(model=model), retry=True)
    return [session_from_proto(s) for s in reply.sessions]


def drain_worker(worker_id: str) -> Plan[WorkerInfo]:
    """`Client.drain_worker`."""
    reply = yield Unary("cluster", "DrainWorker", cluster_pb2.DrainWorkerRequest(worker_id=worker_id))
    return catalog_convert.worker_from_proto(reply.worker)


def webhook_secret(tenant: str) -> Plan[str]:
    """`Client.webhook_secret`."""
    reply = yield Unary(
        "generation", "GetWebhookSecret", generation_pb2.GetWebhookSecretRequest(tenant=tenant)
    )
    return str(reply.secret)
