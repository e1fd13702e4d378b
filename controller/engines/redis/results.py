"""A worker's result into Redis: checked and shaped once (`core.jobs.accept_result`), then stored
with the events of the job's run not logged yet, in one FINISH script that holds only while the
result's assignment still holds the job (a late or duplicate result changes nothing).

The result is encoded at most once on its way (`core.encoded`, as on the memory engine): when
its artifacts stay as they came (inline, under the limit), FINISH stores the worker's message
stamped with the controller's ids instead of converting the result back, and a `Generate` here
that FINISH answered sends those stored bytes instead of converting the job's result again.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol

import redis.exceptions

from omnirt._internal import convert
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.encoded import EncodedJob, ResultEncoding
from omnirt.controller.core.jobs import JobRecord, accept_result, end_state
from omnirt.controller.engines.redis.records import Finished
from omnirt.controller.engines.redis.run_events import RunEventBuffer
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.controller.engines.redis.waiters import Waiters
from omnirt.controller.observability import tracing
from omnirt.errors import OmniRTError
from omnirt.types import EventKind, GenerateResult, Job, JobError, JobEvent, JobState

log = logging.getLogger("omnirt.controller")


class ResultEngine(Protocol):
    """What storing a result needs of the engine."""

    @property
    def store(self) -> RedisJobStore: ...
    @property
    def config(self) -> ControllerConfig: ...
    @property
    def run_events(self) -> RunEventBuffer: ...
    @property
    def waiters(self) -> Waiters: ...
    @property
    def encodings(self) -> EncodedResults: ...

    store_ok: bool
    pending: list[Callable[[], Awaitable[None]]]  # results kept while Redis is away

    async def requeue(
        self, job_id: str, assignment_id: str, message: str, lease_before_ms: int = 0
    ) -> None: ...
    def closed(self, job_id: str, state: JobState, error: JobError | None) -> None: ...


class EncodedResults:
    """The Redis engine's side of `core.encoded`: the worker stream's results as they came (held
    while the engine takes each), and the stored result bytes of the jobs FINISH answered to a
    `Generate` here, until that `Generate` sends them (the newest `keep` at most: one whose
    caller left is dropped in time)."""

    def __init__(self, keep: int = 1024) -> None:
        self._arriving: dict[str, tuple[str, ResultEncoding]] = {}
        self._answered: OrderedDict[str, tuple[Job, bytes]] = OrderedDict()
        self._keep = keep

    @contextlib.contextmanager
    def arriving(self, job_id: str, assignment_id: str, encoding: ResultEncoding) -> Iterator[None]:
        self._arriving[job_id] = (assignment_id, encoding)
        try:
            yield
        finally:
            self._arriving.pop(job_id, None)

    def take_arriving(self, job_id: str, assignment_id: str) -> ResultEncoding | None:
        """The result of `job_id` under `assignment_id` as it came, if the stream handed it over."""
        arrived = self._arriving.pop(job_id, None)
        return arrived[1] if arrived is not None and arrived[0] == assignment_id else None

    def answered(self, job: Job, result: bytes) -> None:
        """FINISH answered `job` (to a waiting `Generate`), whose stored result is `result`."""
        self._answered[job.id] = (job, result)
        self._answered.move_to_end(job.id)
        while len(self._answered) > self._keep:
            self._answered.popitem(last=False)

    def encoded(self, job: Job) -> EncodedJob | None:
        """`job`'s bytes when it is the job FINISH answered (the very object), once."""
        answered = self._answered.pop(job.id, None)
        if answered is None or answered[0] is not job or job.result is None:
            return None
        return EncodedJob(convert.job_to_proto(job, with_result=False).SerializeToString(), answered[1])


async def store_or_keep(engine: ResultEngine, store: Callable[[], Awaitable[None]], job_id: str) -> None:
    """Run `store` (a result's storing); kept for a retry while Redis is away."""
    try:
        await store()
    except redis.exceptions.RedisError:
        engine.store_ok = False
        log.warning("job store unavailable: result of %s kept for a retry", job_id)
        engine.pending.append(store)
    except Exception:
        log.exception("storing the result of %s failed", job_id)


def _now_ms() -> int:
    return int(time.time() * 1000)


async def store_result(
    engine: ResultEngine,
    worker_id: str,
    assignment_id: str,
    job_id: str,
    result: GenerateResult | None,
    error: JobError | None,
    record: JobRecord | None = None,
    run_events: list[JobEvent] | None = None,
    now_ms: int = 0,
    wire: ResultEncoding | None = None,
) -> None:
    """Store a worker's result; `record` is the job's as this controller dispatched it (its
    request and tenant, read from Redis without it), `run_events` the events of its run not
    logged yet (logged first, in the same script), `now_ms` when the result came (default now),
    `wire` the result as it came (stored as it is when the view kept its artifacts)."""
    now = now_ms or _now_ms()
    await engine.run_events.settled()  # the job's events written before are in Redis first
    if error is not None and error.code == "UNAVAILABLE":  # the worker gave the job up: retry it
        await engine.requeue(job_id, assignment_id, f"worker {worker_id} gave the job up: {error.message}")
        return
    state_event = JobEvent(job_id=job_id, kind=EventKind.STATE, worker_id=worker_id, error=error)
    artifacts: dict[int, bytes] = {}
    view, encoded = None, None
    if error is not None:
        state_event.state = end_state(error)
    else:
        assert result is not None
        state_event.state = JobState.SUCCEEDED
        if record is not None:
            request, tenant = record.plan.request, record.job.tenant
        else:
            try:
                stored = await engine.store.load(job_id)
            except OmniRTError:
                log.info("result of an unknown or expired job ignored", extra={"job_id": job_id})
                return
            request, tenant = stored.request, stored.job.tenant
        limit = request.inline_limit_bytes or engine.config.inline_limit_bytes
        trace_id = tracing.trace_id_of(job_id)
        view = accept_result(result, job_id, trace_id, tenant, limit)
        if wire is not None and wire.keeps(view):
            encoded = wire.stamped(job_id, trace_id, tenant)
        # Objects in the artifact store (`object_uri`) have no bytes here to keep.
        artifacts = {
            a.index: a.data
            for a, v in zip(result.artifacts, view.artifacts, strict=True)
            if not v.data and not a.object_uri
        }
    read_back = engine.waiters.waits_for(job_id)  # a Generate here: no read after this
    if read_back:  # its waiter, woken by FINISH's notification, waits for FINISH's answer
        engine.waiters.expect(("job", job_id), job_id)
    finished = Finished(False, None)
    try:
        finished = await engine.store.finish(
            job_id,
            state_event.state,
            expected=(JobState.RUNNING,),
            assignment_id=assignment_id,
            error=error,
            result=view,
            encoded_result=encoded,
            state_event=state_event,
            result_event=JobEvent(job_id=job_id, kind=EventKind.RESULT, result=view) if view else None,
            artifacts=artifacts,
            now_ms=now,
            run_events=run_events or (),
            worker=worker_id if run_events else "",
            read_back=read_back,
        )
    except OmniRTError:  # the job expired meanwhile
        pass
    finally:
        if finished.job is None:  # no answer for the waiters: each reads the job itself
            engine.waiters.unexpect(("job", job_id))
    if finished.job is not None:
        result_bytes = finished.job.fields.get(b"result")
        if result_bytes:
            engine.encodings.answered(finished.job.job, result_bytes)
        engine.waiters.answer(("job", job_id), job_id, finished.job)
    if finished.changed:
        engine.closed(job_id, state_event.state, error)
    else:
        log.info("late result ignored", extra={"job_id": job_id, "worker_id": worker_id})
