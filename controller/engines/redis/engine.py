"""`RedisEngine`: the controller's engine with jobs, queue, leases and events in Redis.

Several controllers may share one Redis: any of them accepts, reads, watches and cancels any
job, and each dispatches queued jobs to the workers connected to it. A job RUNNING on a worker
holds a lease (`P running`) that the controller holding the worker renews; when a controller
dies its leases expire and any controller puts those jobs back in the queue (bounded by
`--max-attempts`). A result is accepted only from the assignment that still holds the job, so a
client sees exactly one result even when a job ran twice. See docs/operations.md, "Redis".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import redis.exceptions

from omnirt._internal.protocol.messages import CancelAssignment, ModelLoaded
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.batching import (
    batch_key,
    batch_key_id,
    batch_limit,
    pinned_backend,
    queue_name,
    step_key,
    step_rows,
)
from omnirt.controller.core.bounds import check_id, echo
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.jobs import (
    JobRecord,
    Unserved,
    log_finished,
    log_worker_gone,
    new_job,
    request_fingerprint,
    requeue_unheld,
    result_with,
    utcnow,
    waiting_reason,
    worker_joined,
)
from omnirt.controller.core.model_loads import ModelLoads
from omnirt.controller.core.router import (
    WorkerHandle,
    WorkerLink,
    WorkerRegistry,
    model_warnings,
)
from omnirt.controller.core.tenants import (
    REASON_RATE,
    UNLIMITED,
    RunTimes,
    TenantPolicy,
    queued_exceeded,
    rate_exceeded,
)
from omnirt.controller.core.validation import Plan, validate
from omnirt.controller.engines.redis.cluster import Cluster
from omnirt.controller.engines.redis.records import QuotaRefusal, StoredJob
from omnirt.controller.engines.redis.results import EncodedResults, store_or_keep, store_result
from omnirt.controller.engines.redis.run_events import RunEventBuffer
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.controller.engines.redis.upkeep import SLOW_TICK_S, RedisUpkeep
from omnirt.controller.engines.redis.waiters import Waiters, raise_lost_cancel
from omnirt.controller.observability.metrics import EngineMetrics, Gauges
from omnirt.controller.observability.tracing import JobTracing
from omnirt.errors import AlreadyExists, InvalidRequest, OmniRTError, QuotaExceeded, Unavailable
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
    Task,
    WorkerInfo,
)

log = logging.getLogger("omnirt.controller")
# How long a stopping controller waits for the worker results it is storing.
STOP_STORING_S = 5.0
EVENT_PAGE = 512


def _now_ms() -> int:
    return int(time.time() * 1000)


class RedisEngine:
    """`EngineClient` on Redis (see the module doc)."""

    def __init__(self, config: ControllerConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.store = RedisJobStore(
            config.store,
            job_ttl_s=config.job_ttl_s,
            idempotency_ttl_s=config.idempotency_ttl_s,
            artifact_limit_bytes=config.store_artifact_limit_bytes,
            artifact_dir=config.artifact_dir,
        )
        self.id = f"ctl-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.workers = WorkerRegistry()
        self.model_loads = ModelLoads(self.workers, catalog)  # ModelService.LoadModel / UnloadModel
        self.metrics = EngineMetrics(self)
        self.tracing = JobTracing()
        # Each model's run time per job as this controller's workers saw it: what fair share
        # charges a tenant per job (passed to Redis with each submission).
        self.run_times = RunTimes()
        self.unserved = Unserved(config.unserved_wait_s, config.expected_models)
        # Jobs this controller takes part in (submitted here, or running on one of its workers).
        self.records: dict[str, JobRecord] = {}
        self.running: dict[str, JobRecord] = {}
        self.waiters = Waiters()  # Generate's and WatchJob's on this controller
        self.encodings = EncodedResults()  # results as they came, answers as stored (core.encoded)
        # Worker results being stored (each beside the worker's stream, see worker_result).
        self._storing: set[asyncio.Task[None]] = set()
        # Events of running jobs on their way to Redis, written together (run_events.py).
        self.run_events = RunEventBuffer(self.store, self.waiters.notify_run_events, self._store_lost)
        self.wake = asyncio.Event()
        self.store_ok = True
        # Worker results that could not be stored yet (Redis away): retried every tick.
        self.pending: list[Callable[[], Awaitable[None]]] = []
        self.depth = Gauges()  # the cluster's queue and running jobs, read on each upkeep tick
        # The queues of jobs pinned to a backend that exist (`model@backend`): submitted here, or
        # seen in Redis's `pinned` set on an upkeep tick. Dispatch claims from these too.
        self.pinned_queues: set[str] = set()
        self.cluster = Cluster(self.store, self.id, self.workers, config.lease_timeout_ms, SLOW_TICK_S)
        self.upkeep = RedisUpkeep(self)

    # ---- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        with contextlib.suppress(Exception):
            await self.store.ping()
        self.upkeep.start()
        log.info("job store: %s (controller %s)", self.config.store, self.id)

    async def stop(self) -> None:
        if self._storing:  # results on their way to Redis: a moment for them before the close
            await asyncio.wait(set(self._storing), timeout=STOP_STORING_S)
        await self.upkeep.stop()
        for handle in self.workers.all():
            handle.link.close()
        with contextlib.suppress(Exception):
            await self.store.close()

    def ready(self) -> bool:
        return self.store_ok

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Redis errors become UNAVAILABLE for the caller (and mark the controller not ready)."""
        try:
            yield
        except redis.exceptions.RedisError as exc:
            self.store_ok = False
            raise Unavailable(f"the job store is unavailable ({self.config.store}): {exc}") from exc

    # ---- public operations ----------------------------------------------------------------

    def validate(self, request: GenerateRequest) -> Plan:
        return validate(request, self.catalog)

    async def submit(
        self,
        request: GenerateRequest,
        *,
        tenant: str = "",
        policy: TenantPolicy = UNLIMITED,
        call_deadline_ms: int = 0,
    ) -> tuple[Job, bool]:
        try:
            return await self._submit(request, tenant, policy, call_deadline_ms)
        except OmniRTError as exc:
            self.metrics.request_rejected(request, exc, tenant)
            raise

    async def _submit(
        self, request: GenerateRequest, tenant: str, policy: TenantPolicy, call_deadline_ms: int
    ) -> tuple[Job, bool]:
        started_ns = time.time_ns()
        plan = self.validate(request)
        validated_ns = time.time_ns()
        # After validation, which bounds what it hashes (a 50 MiB prompt, 32 MiB of inputs); only
        # an idempotency key's duplicates are compared with it (as on the memory engine).
        fingerprint = request_fingerprint(request) if request.idempotency_key else b""
        backend = pinned_backend(plan)
        self.unserved.check_submit(plan.spec, self.cluster.serving(plan.spec, backend), backend)
        job = new_job(plan, call_deadline_ms, tenant)
        aging = self.config.priority_aging_s
        rank = (time.time() / aging if aging > 0 else 0.0) - job.priority
        key = batch_key_id(batch_key(plan, batch_limit(self.config, plan.spec)))
        queued = JobEvent(job_id=job.id, kind=EventKind.STATE, state=JobState.QUEUED, time=utcnow())
        record = JobRecord(job=job, plan=plan, fingerprint=fingerprint)
        # The span first: its context is stored with the job, for the controller that dispatches it.
        self.tracing.submitted(record, started_ns, validated_ns)
        traceparent = self.tracing.traceparent(job.id)
        try:
            with self._guard():
                if backend:
                    await self.store.note_pinned(queue_name(plan.spec.id, backend))
                    self.pinned_queues.add(queue_name(plan.spec.id, backend))
                existing = await self.store.submit(
                    job,
                    plan.request,
                    fingerprint,
                    key,
                    rank,
                    self.config.max_queue,
                    queued,
                    traceparent,
                    policy=policy,
                    cost_s=self.run_times.estimate(job.model),
                    aging_s=aging,
                    step_key=batch_key_id(step_key(plan)),
                    step_rows=step_rows(plan),
                    queue=queue_name(plan.spec.id, backend),
                )
                if existing is not None:
                    stored = await self.store.load(existing)
                    if stored.fingerprint != fingerprint:
                        raise InvalidRequest(
                            f"idempotency_key: {echo(request.idempotency_key)} was used for a different "
                            f"request (job {existing})",
                            field="idempotency_key",
                        )
                    self.tracing.discard(job.id)
                    return stored.job, True
        except QuotaRefusal as refusal:
            self.tracing.discard(job.id)
            raise self._quota_error(tenant, policy, refusal) from None
        except BaseException:
            self.tracing.discard(job.id)
            raise
        self.records[job.id] = record
        self.metrics.request_accepted(record)
        log.debug("job queued", extra={"job_id": job.id, "model": job.model, "tenant": tenant})
        self.upkeep.queued()
        return job, False

    def _quota_error(self, tenant: str, policy: TenantPolicy, refusal: QuotaRefusal) -> QuotaExceeded:
        """The client's error for a refusal SUBMIT decided in Redis (the memory engine's words)."""
        self.metrics.quota_refused(tenant, refusal.reason)
        log.info("submission refused by quota", extra={"tenant": tenant, "reason": refusal.reason})
        if refusal.reason == REASON_RATE:
            return rate_exceeded(tenant, policy, refusal.wait_s)
        return queued_exceeded(tenant, refusal.active, policy)

    async def _load(self, job_id: str, tenant: str | None = None) -> StoredJob:
        """The job; with `tenant`, NOT_FOUND unless it is that tenant's (as for an unknown id)."""
        check_id("job_id", job_id)  # every lookup of a client's job id comes here
        with self._guard():
            return await self.store.load(job_id, tenant)

    async def wait(self, job_id: str) -> Job:
        with self.waiters.waiting(job_id, run_events=False) as changed:
            # A job submitted here exists, and was QUEUED a moment ago: unless it changed since
            # (a notification nobody here heard), the first look is at the first wake-up.
            look = job_id not in self.records or self.waiters.unheard(job_id)
            if job_id not in self.records:
                await self._load(job_id)  # NOT_FOUND for an unknown job
            notified = False if look else await changed()
            while True:
                # Woken by a change of state (not the run's events), most likely the final one:
                # the job at once (one read; none when this controller stored its result: FINISH
                # answered it). Otherwise (the first look, a look every WAIT_S) only its state,
                # then the job once final. Each read is shared by the job's waiters here.
                with self._guard():
                    if notified:
                        stored = await self.waiters.shared(("job", job_id), lambda: self._load(job_id))
                        if stored.job.state.terminal:
                            return stored.job
                    state = await self.waiters.shared(("state", job_id), lambda: self.store.state(job_id))
                raise_lost_cancel()  # the client went away during that call
                if state is None or state.terminal:
                    return (await self._load(job_id)).job
                notified = await changed()

    async def get(self, job_id: str, *, tenant: str | None = None) -> Job:
        stored = await self._load(job_id, tenant)
        job = stored.job
        if job.state is JobState.QUEUED:
            with self._guard():
                job.queue_position = await self.store.position(job_id)
            with contextlib.suppress(Exception):
                spec = self.catalog.resolve(job.model)
                backend = pinned_backend(Plan(spec, stored.request))
                serving = self.cluster.serving(spec, backend)
                job.waiting_reason = waiting_reason(spec, serving, self.unserved, backend)
        return job

    async def request_of(self, job_id: str, *, tenant: str | None = None) -> GenerateRequest:
        return (await self._load(job_id, tenant)).request

    async def list_jobs(
        self, states: list[JobState], model: str, limit: int, offset: int, *, tenant: str | None = None
    ) -> tuple[list[Job], int]:
        with self._guard():
            ids, more = await self.store.list_ids(states, model, limit, offset, tenant)
        jobs = []
        for job_id in ids:
            with contextlib.suppress(OmniRTError):  # expired between the listing and now
                jobs.append(await self.get(job_id, tenant=tenant))
        return jobs, (offset + limit if more else 0)

    async def watch(
        self, job_id: str, after_sequence: int = 0, *, tenant: str | None = None
    ) -> AsyncIterator[JobEvent]:
        with self.waiters.waiting(job_id) as changed:
            await self._load(job_id, tenant)  # NOT_FOUND for an unknown job (or another tenant's)
            seq = after_sequence
            while True:
                with self._guard():
                    # One read for every watcher here at this point of the job's events.
                    state, events = await self.waiters.shared(
                        ("events", job_id, seq), functools.partial(self._state_and_events, job_id, seq)
                    )
                raise_lost_cancel()  # the watcher went away during those calls
                for event in events:
                    seq = event.sequence
                    yield event
                if (state is None or state.terminal) and len(events) < EVENT_PAGE:
                    return
                if not events:
                    await changed()

    async def _state_and_events(self, job_id: str, after: int) -> tuple[JobState | None, list[JobEvent]]:
        # The state first: a final state's events are logged in the same script, so once it is
        # final every event is in the stream.
        state = await self.store.state(job_id)
        return state, await self.store.events(job_id, after, EVENT_PAGE)

    def _store_lost(self) -> None:
        self.store_ok = False

    async def cancel(self, job_id: str, *, tenant: str | None = None) -> tuple[Job, bool]:
        error = JobError("CANCELLED", "cancelled by the client")
        return await self.end(job_id, JobState.CANCELLED, error, tenant=tenant)

    async def end(
        self,
        job_id: str,
        state: JobState,
        error: JobError,
        *,
        tenant: str | None = None,
        expected: tuple[JobState, ...] = (JobState.QUEUED, JobState.RUNNING),
    ) -> tuple[Job, bool]:
        """Cancel or expire a job (queued or running, or `expected`); a running one is told to stop."""
        stored = await self._load(job_id, tenant)
        if stored.job.state.terminal:
            return stored.job, False
        event = JobEvent(
            job_id=job_id, kind=EventKind.STATE, state=state, error=error, worker_id=stored.job.worker_id
        )
        run_events = self.run_events.take(job_id)  # what its run did before it ends
        await self.run_events.settled()
        with self._guard():
            finished = await self.store.finish(
                job_id,
                state,
                expected=expected,
                error=error,
                state_event=event,
                now_ms=_now_ms(),
                run_events=run_events,
                read_back=True,
            )
        if finished.changed and finished.before is JobState.RUNNING:
            await self._stop(job_id, finished.assignment, finished.owner, error.code)
        if finished.job is not None:
            self.waiters.answer(("job", job_id), job_id, finished.job)
        if finished.changed:
            self.closed(job_id, state, error)
        return (finished.job or await self._load(job_id)).job, finished.changed

    async def _stop(self, job_id: str, assignment_id: str, owner: str, reason: str) -> None:
        """Tell the worker running `job_id` to stop: ours directly, another controller's through Redis."""
        if owner == self.id:
            self.stop_local(job_id, assignment_id, reason)
        else:
            with contextlib.suppress(redis.exceptions.RedisError):
                await self.store.publish(f"c {job_id} {assignment_id} {owner} {reason}")

    def stop_local(self, job_id: str, assignment_id: str, reason: str) -> None:
        record = self.running.get(job_id)
        if record is None or record.assignment_id != assignment_id:
            return
        with contextlib.suppress(Exception):
            self.workers.get(record.job.worker_id).link.send(CancelAssignment(assignment_id, job_id, reason))

    def closed(self, job_id: str, state: JobState, error: JobError | None) -> None:
        """A job this controller knows reached a final state: let the observers see it."""
        self.waiters.notify(job_id)
        record = self.records.pop(job_id, None) or self.running.get(job_id)
        if record is None:
            self.tracing.discard(job_id)  # adopted here once, then requeued and run elsewhere
            return
        record.job.state, record.job.error = state, error
        self.metrics.finished(record)
        self.tracing.finished(record)
        log_finished(job_id, record.job.tenant, state, error)

    async def abandon(self, job_id: str) -> None:
        stored = await self._load(job_id)
        if stored.job.state.terminal:
            return
        deadline = stored.job.deadline_ms
        if deadline and _now_ms() + 100 >= deadline:
            await self.end(job_id, JobState.FAILED, JobError("DEADLINE_EXCEEDED", "deadline passed"))
        else:
            await self.cancel(job_id)

    async def artifact(
        self, job_id: str, index: int, *, tenant: str | None = None
    ) -> tuple[bytes, GenerateResult]:
        stored = await self._load(job_id, tenant)
        result = result_with(job_id, stored.job.state, stored.job.result, index)
        return self.store.artifacts.data_of(job_id, stored.fields, index, result.artifacts[index]), result

    def list_models(self, task: Task | None = None) -> list[ModelSpec]:
        return [self._with_serving(s) for s in self.catalog if task is None or task in s.tasks]

    def describe_model(self, name: str) -> ModelSpec:
        return self._with_serving(self.catalog.resolve(name))

    def _with_serving(self, spec: ModelSpec) -> ModelSpec:
        warm_on = self.cluster.warm_on(spec, self.model_loads.warm_on(spec))
        return dataclasses.replace(spec, serving_workers=self.cluster.serving(spec), warm_on=warm_on)

    async def list_workers(self) -> list[WorkerInfo]:
        return await self.cluster.listing()

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        check_id("worker_id", worker_id)
        with self._guard():
            return await self.cluster.drain(worker_id)

    async def load_model(
        self, name: str, workers: int, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.model_loads.load(name, workers, worker_ids, wait_s)

    async def unload_model(
        self, name: str, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.model_loads.unload(name, worker_ids, wait_s)

    async def worker_model_answer(self, handle: WorkerHandle, answer: ModelLoaded) -> None:
        self.model_loads.answered(handle, answer)

    def gauge_snapshot(self) -> Gauges:
        return dataclasses.replace(self.depth, workers=[w.snapshot() for w in self.workers.all()])

    # ---- worker side ----------------------------------------------------------------------

    async def worker_connected(self, info: WorkerInfo, link: WorkerLink) -> WorkerHandle:
        """Register a worker (AlreadyExists when another live process holds its id, here or on
        another controller: the claim in Redis decides, in one script, see `CLAIM_WORKER`)."""
        info.connected_at = info.last_heartbeat_at = utcnow()
        handle = WorkerHandle(info=info, link=link, warnings=model_warnings(info, self.catalog))
        lease_s = self.config.lease_timeout_ms / 1000
        try:
            self.workers.check(info, lease_s)
            await self.cluster.claim(info)
            old = self.workers.add(handle, lease_s)
        except AlreadyExists as exc:
            log.warning("worker refused: %s", exc.message, extra={"worker_id": info.id})
            raise
        await worker_joined(handle, old, self._lose_jobs)
        await self.cluster.listed(handle)
        self.wake.set()
        return handle

    async def worker_heartbeat(
        self,
        handle: WorkerHandle,
        loaded_models: list[str],
        draining: bool,
        running: set[tuple[str, str]] | None = None,
        model_bytes: dict[str, int] | None = None,
    ) -> None:
        handle.heartbeat(loaded_models, draining, model_bytes)
        if await requeue_unheld(handle, running, self._requeue_lost):
            self.wake.set()

    async def worker_event(self, handle: WorkerHandle, assignment_id: str, event: JobEvent) -> None:
        handle.last_seen = time.monotonic()
        if event.kind is EventKind.STATE or event.kind is EventKind.RESULT:
            return  # the controller owns state changes; results come as AssignmentResult
        progress = event.progress if event.kind is EventKind.PROGRESS else None
        record = self.running.get(event.job_id)
        if record is not None and record.assignment_id == assignment_id:
            self.metrics.worker_event(record, event)
            self.tracing.worker_event(record)
        # Written with others in a moment, or with the job's result (dropped while Redis is away:
        # progress is live information).
        self.run_events.add(event.job_id, assignment_id, event, progress)

    async def worker_result(
        self,
        handle: WorkerHandle,
        assignment_id: str,
        job_id: str,
        result: GenerateResult | None,
        error: JobError | None,
    ) -> None:
        handle.last_seen = time.monotonic()
        if self.workers.release(handle, job_id, assignment_id):
            self.wake.set()
        record = self.running.get(job_id)
        if record is not None and record.assignment_id == assignment_id:
            del self.running[job_id]
            self.metrics.result_received(record)
            if record.dispatched_at:
                elapsed = time.monotonic() - record.dispatched_at
                self.run_times.observe(record.job.model, elapsed, record.batch_size)
        else:
            record = None
        run_events = self.run_events.take(job_id, assignment_id)
        arrived_ms = _now_ms()  # the job's finished_at: when its result came, not when it was stored
        wire = self.encodings.take_arriving(job_id, assignment_id)

        async def store() -> None:
            await store_result(
                self, handle.id, assignment_id, job_id, result, error, record, run_events, arrived_ms, wire
            )

        # Stored beside the worker's stream, not in its way: a Redis that hangs (SIGSTOP, a
        # network partition) must not stop this controller from reading the worker's heartbeats,
        # or it would take a healthy worker for lost (tests/integration/test_redis_sigstop.py).
        task = asyncio.create_task(store_or_keep(self, store, job_id))
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)

    async def requeue(self, job_id: str, assignment_id: str, message: str, lease_before_ms: int = 0) -> None:
        """Queue a running job again (or fail it when its attempts are spent)."""
        outcome, failed_error = await self.store.requeue(
            job_id,
            message,
            assignment_id=assignment_id,
            lease_before_ms=lease_before_ms,
            max_attempts=self.config.max_attempts,
            now_ms=_now_ms(),
        )
        record = self.running.pop(job_id, None)
        if outcome == "queued":
            tenant = record.job.tenant if record is not None else ""
            log.info("job requeued", extra={"job_id": job_id, "tenant": tenant, "reason": message})
            if record is not None:
                self.metrics.requeued(record)
                self.tracing.requeued(record, message)
                self.records.setdefault(job_id, record)
            self.upkeep.queued()
        elif outcome == "failed":
            if record is not None:
                self.records.setdefault(job_id, record)
            self.closed(job_id, JobState.FAILED, failed_error)

    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None:
        if self.workers.remove(handle):
            log_worker_gone(handle, reason)
            await self._lose_jobs(handle, reason)
            self.model_loads.worker_lost(handle)
            await self.cluster.dropped(handle)
            self.wake.set()

    async def _lose_jobs(self, handle: WorkerHandle, reason: str) -> None:
        for job_id, assignment_id in list(handle.running.items()):
            await self._requeue_lost(
                job_id, assignment_id, f"worker {handle.id} was lost while running the job ({reason})"
            )
        handle.release_all()

    async def _requeue_lost(self, job_id: str, assignment_id: str, message: str) -> None:
        """`requeue` a job its worker no longer runs. While Redis is away the job stays in
        `running`: the next lease renewal requeues it (or, should this controller stop, its
        lease expires and any controller does)."""
        try:
            await self.requeue(job_id, assignment_id, message)
        except redis.exceptions.RedisError:
            self.store_ok = False
