"""`MemoryEngine`: the default engine, with jobs in this process's memory.

It implements `EngineClient` itself: it validates, queues and tracks jobs and knows the
connected workers; its background loops (dispatch, the reaper) run beside it in `upkeep.py`, as
the Redis engine's do. It works on `omnirt.types` dataclasses and reaches workers through
`WorkerLink`. Nothing here waits on I/O: every call but `wait` and `watch` runs to its end
without suspending.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import time
from collections.abc import AsyncIterator, Hashable

from omnirt._internal.protocol.messages import CancelAssignment, ModelLoaded
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.batching import batch_key, batch_limit, pinned_backend
from omnirt.controller.core.bounds import check_id, echo
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.jobs import (
    JobRecord,
    Unserved,
    accept_result,
    end_state,
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
    REASON_QUEUED,
    REASON_RATE,
    UNLIMITED,
    Buckets,
    FairClock,
    RunTimes,
    TenantPolicy,
    queued_exceeded,
    rate_exceeded,
)
from omnirt.controller.core.validation import Plan, validate
from omnirt.controller.engines.memory.queue import JobQueue
from omnirt.controller.engines.memory.store import JobStore
from omnirt.controller.engines.memory.upkeep import MemoryUpkeep
from omnirt.controller.observability import tracing
from omnirt.controller.observability.metrics import EngineMetrics, Gauges
from omnirt.controller.observability.tracing import JobTracing
from omnirt.errors import AlreadyExists, InvalidRequest, OmniRTError
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


class MemoryEngine:
    """`EngineClient` in memory (see the module doc): validates, queues and tracks jobs; knows
    the connected workers."""

    def __init__(self, config: ControllerConfig, catalog: Catalog) -> None:
        self.config = config
        self.catalog = catalog
        self.store = JobStore(max_finished=config.max_finished_jobs, ttl_s=config.job_ttl_s)
        self.queue = JobQueue(config.max_queue, config.priority_aging_s)
        self.workers = WorkerRegistry()
        self.model_loads = ModelLoads(self.workers, catalog)  # ModelService.LoadModel / UnloadModel
        # Jobs queued or running.
        self.live: dict[str, JobRecord] = {}
        # Tenant -> its jobs queued or running (max_queued, and the active-jobs gauge).
        self._active: dict[str, int] = {}
        self._buckets = Buckets()
        self._fair = FairClock()
        self.run_times = RunTimes()
        self.unserved = Unserved(config.unserved_wait_s, config.expected_models)
        # (deadline_ms, job id) of live jobs with a deadline: the reaper looks at the due ones only.
        self.deadlines: list[tuple[int, str]] = []
        self.wake = asyncio.Event()  # the dispatch loop's: a job or a free slot came
        # Observers of the job life cycle: they only watch, never change what the engine does.
        self.metrics = EngineMetrics(self)
        self.tracing = JobTracing()
        self.upkeep = MemoryUpkeep(self)

    # ---- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.upkeep.start()

    async def stop(self) -> None:
        await self.upkeep.stop()
        for handle in self.workers.all():
            handle.link.close()

    def ready(self) -> bool:
        return True  # no store to lose

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
        """Queue a request of `tenant`; returns the job and whether an idempotency key matched an
        existing one of that tenant."""
        try:
            record, deduplicated = self._submit(request, tenant, policy, call_deadline_ms)
        except OmniRTError as exc:
            self.metrics.request_rejected(request, exc, tenant)
            raise
        self.metrics.request_accepted(record)
        return record.job, deduplicated

    def _submit(
        self, request: GenerateRequest, tenant: str, policy: TenantPolicy, call_deadline_ms: int
    ) -> tuple[JobRecord, bool]:
        started_ns = time.time_ns()
        # Validation first, as on Redis: it bounds what the fingerprint hashes (a 50 MiB prompt).
        plan = self.validate(request)
        validated_ns = time.time_ns()
        # Only an idempotency key is ever compared with it: no hashing for the other requests.
        fingerprint = request_fingerprint(request) if request.idempotency_key else b""
        if request.idempotency_key:
            existing = self.store.by_idempotency_key(tenant, request.idempotency_key)
            if existing is not None:
                if existing.fingerprint != fingerprint:
                    raise InvalidRequest(
                        f"idempotency_key: {echo(request.idempotency_key)} was used for a different request "
                        f"(job {existing.job.id})",
                        field="idempotency_key",
                    )
                return existing, True
        self.queue.check_room()
        backend = pinned_backend(plan)
        self.unserved.check_submit(plan.spec, self.workers.serving_count(plan.spec, backend), backend)
        self._check_quota(tenant, policy)
        job = new_job(plan, call_deadline_ms, tenant)
        record = JobRecord(job=job, plan=plan, fingerprint=fingerprint)
        if tenant:
            cost = self.run_times.estimate(job.model)
            record.start_s = self._fair.start(tenant, job.priority, cost, policy.weight, record.enqueued_at)
        self.tracing.submitted(record, started_ns, validated_ns)
        self.store.add(record)
        self.live[job.id] = record
        self._active[tenant] = self._active.get(tenant, 0) + 1
        if job.deadline_ms:
            heapq.heappush(self.deadlines, (job.deadline_ms, job.id))
        self.queue.push(record, self._batch_key(record))
        record.append(JobEvent(job_id=job.id, kind=EventKind.STATE, state=JobState.QUEUED))
        log.debug("job queued", extra={"job_id": job.id, "model": job.model, "tenant": tenant})
        self.wake.set()
        return record, False

    def _check_quota(self, tenant: str, policy: TenantPolicy) -> None:
        """QuotaExceeded when `tenant` is at `max_queued` or out of rate tokens (a token is
        spent only by a submission that passes every other check)."""
        active = self._active.get(tenant, 0)
        if policy.max_queued and active >= policy.max_queued:
            self.metrics.quota_refused(tenant, REASON_QUEUED)
            raise queued_exceeded(tenant, active, policy)
        wait_s = self._buckets.take(tenant, policy, time.monotonic())
        if wait_s:
            self.metrics.quota_refused(tenant, REASON_RATE)
            raise rate_exceeded(tenant, policy, wait_s)

    def record(self, job_id: str, *, tenant: str | None = None) -> JobRecord:
        """The job's record; with `tenant`, JobNotFound unless the job is that tenant's."""
        check_id("job_id", job_id)
        return self.store.get(job_id, tenant)

    async def wait(self, job_id: str) -> Job:
        """The job once it is final."""
        record = self.store.get(job_id)
        await record.wait_final()
        return record.job

    async def get(self, job_id: str, *, tenant: str | None = None) -> Job:
        """The job as clients see it (with queue position and waiting reason when queued)."""
        record = self.record(job_id, tenant=tenant)
        job = record.job
        if job.state is JobState.QUEUED:
            job.queue_position = self.queue.position(job_id)
            job.waiting_reason = self._waiting_reason(record.plan)
        return job

    async def request_of(self, job_id: str, *, tenant: str | None = None) -> GenerateRequest:
        return self.record(job_id, tenant=tenant).plan.request

    async def list_jobs(
        self, states: list[JobState], model: str, limit: int, offset: int, *, tenant: str | None = None
    ) -> tuple[list[Job], int]:
        """Newest first, only `tenant`'s when given; returns the page and the next offset (0 when
        there is no more)."""
        page, more = self.store.list(states, model, limit, offset, tenant)
        return [r.job for r in page], (offset + limit if more else 0)

    async def watch(
        self, job_id: str, after_sequence: int = 0, *, tenant: str | None = None
    ) -> AsyncIterator[JobEvent]:
        """The job's events after `after_sequence`, live, until its final state event."""
        record = self.record(job_id, tenant=tenant)
        seq = after_sequence
        while True:
            events = await record.wait_after(seq)
            for event in events:
                yield event
            seq += len(events)
            if record.job.state.terminal and seq >= len(record.events):
                return

    async def cancel(self, job_id: str, *, tenant: str | None = None) -> tuple[Job, bool]:
        """Cancel a queued or running job; a finished job is left as it is (returns False)."""
        record = self.record(job_id, tenant=tenant)
        job = record.job
        if job.state.terminal:
            return job, False
        if job.state is JobState.RUNNING:
            with contextlib.suppress(Exception):
                handle = self.workers.get(job.worker_id)
                handle.link.send(CancelAssignment(record.assignment_id, job_id, "CANCELLED"))
        self.queue.remove(job_id)
        self._finish(record, JobState.CANCELLED, JobError("CANCELLED", "cancelled by the client"))
        return job, True

    async def abandon(self, job_id: str) -> None:
        """The client of a `Generate` went away: past its deadline the job expires, else it is cancelled."""
        record = self.store.get(job_id)
        if record.job.state.terminal:
            return
        deadline = record.job.deadline_ms
        # gRPC ends the call at the deadline; allow for the clocks' granularity.
        if deadline and time.time() * 1000 + 100 >= deadline:
            self.expire(record)
        else:
            await self.cancel(job_id)

    async def artifact(
        self, job_id: str, index: int, *, tenant: str | None = None
    ) -> tuple[bytes, GenerateResult]:
        """The full bytes of one artifact of a succeeded job."""
        record = self.record(job_id, tenant=tenant)
        result = result_with(job_id, record.job.state, record.result, index)
        return result.artifacts[index].data, result

    def list_models(self, task: Task | None = None) -> list[ModelSpec]:
        return [self._with_serving(s) for s in self.catalog if task is None or task in s.tasks]

    def describe_model(self, name: str) -> ModelSpec:
        return self._with_serving(self.catalog.resolve(name))

    async def list_workers(self) -> list[WorkerInfo]:
        return [w.snapshot() for w in self.workers.all()]

    def gauge_snapshot(self) -> Gauges:
        """Queued jobs by model and priority, running jobs by model, and the workers (the gauges)."""
        gauges = Gauges(workers=[w.snapshot() for w in self.workers.all()])
        for record in self.live.values():
            job = record.job
            if job.state is JobState.QUEUED:
                gauges.queued_by_model[job.model] = gauges.queued_by_model.get(job.model, 0) + 1
                gauges.queued_by_priority[job.priority] = gauges.queued_by_priority.get(job.priority, 0) + 1
            elif job.state is JobState.RUNNING:
                gauges.running_by_model[job.model] = gauges.running_by_model.get(job.model, 0) + 1
        gauges.active_by_tenant.update(self._active)
        return gauges

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        check_id("worker_id", worker_id)
        handle = self.workers.get(worker_id)
        handle.drain()
        return handle.snapshot()

    async def load_model(
        self, name: str, workers: int, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.model_loads.load(name, workers, worker_ids, wait_s)

    async def unload_model(
        self, name: str, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.model_loads.unload(name, worker_ids, wait_s)

    # ---- worker side ----------------------------------------------------------------------

    async def worker_connected(self, info: WorkerInfo, link: WorkerLink) -> WorkerHandle:
        """Register a worker (AlreadyExists when another live process holds its id)."""
        info.connected_at = info.last_heartbeat_at = utcnow()
        handle = WorkerHandle(info=info, link=link, warnings=model_warnings(info, self.catalog))
        try:
            old = self.workers.add(handle, self.config.lease_timeout_ms / 1000)
        except AlreadyExists as exc:
            log.warning("worker refused: %s", exc.message, extra={"worker_id": info.id})
            raise
        await worker_joined(handle, old, self._lose_jobs)
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
        if await requeue_unheld(handle, running, self._requeue):
            self.wake.set()

    async def worker_model_answer(self, handle: WorkerHandle, answer: ModelLoaded) -> None:
        self.model_loads.answered(handle, answer)

    async def worker_event(self, handle: WorkerHandle, assignment_id: str, event: JobEvent) -> None:
        handle.last_seen = time.monotonic()
        record = self._current(event.job_id, assignment_id)
        if record is None or event.kind is EventKind.STATE or event.kind is EventKind.RESULT:
            return  # the controller owns state changes; results come as AssignmentResult
        if event.kind is EventKind.PROGRESS:
            record.job.progress = event.progress
        record.append(event)
        self.metrics.worker_event(record, event)
        self.tracing.worker_event(record)

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
        record = self._current(job_id, assignment_id)
        if record is None:
            log.info("late result ignored", extra={"job_id": job_id, "worker_id": handle.id})
            return
        self.metrics.result_received(record)
        if error is None and record.dispatched_at:  # what a run of the model takes (fair share)
            elapsed = time.monotonic() - record.dispatched_at
            self.run_times.observe(record.job.model, elapsed, record.batch_size)
        if error is not None:
            if error.code == "UNAVAILABLE":  # the worker gave the job up (drain timeout): retry it
                self._retry_or_fail(record, f"worker {handle.id} gave the job up: {error.message}")
                return
            self._finish(record, end_state(error), error)
            return
        assert result is not None
        limit = record.plan.request.inline_limit_bytes or self.config.inline_limit_bytes
        record.job.result = accept_result(
            result, job_id, tracing.trace_id_of(job_id), record.job.tenant, limit
        )
        record.result = result
        self._finish(record, JobState.SUCCEEDED)  # the store may keep the worker's bytes (core.encoded)

    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None:
        if self.workers.remove(handle):
            log_worker_gone(handle, reason)
            await self._lose_jobs(handle, reason)
            self.model_loads.worker_lost(handle)
            self.wake.set()

    # ---- internals ------------------------------------------------------------------------

    def _current(self, job_id: str, assignment_id: str) -> JobRecord | None:
        """The job if it still runs under this assignment (late or foreign results are ignored)."""
        record = self.live.get(job_id)
        if (
            record is None
            or record.assignment_id != assignment_id
            or record.job.state is not JobState.RUNNING
        ):
            return None
        return record

    async def _lose_jobs(self, handle: WorkerHandle, reason: str) -> None:
        """Requeue (or fail, when attempts are spent) the jobs a lost worker was running."""
        for job_id, assignment_id in list(handle.running.items()):
            await self._requeue(
                job_id, assignment_id, f"worker {handle.id} was lost while running the job ({reason})"
            )
        handle.release_all()

    async def _requeue(self, job_id: str, assignment_id: str, message: str) -> None:
        """Put the job back in the queue (or fail it) if it still runs under `assignment_id`."""
        record = self._current(job_id, assignment_id)
        if record is not None:
            self._retry_or_fail(record, message)

    def _retry_or_fail(self, record: JobRecord, message: str) -> None:
        """Put a running job back in the queue, or fail it with UNAVAILABLE when attempts are spent."""
        job = record.job
        if job.attempts >= self.config.max_attempts:
            error = JobError("UNAVAILABLE", f"{message}; gave up after {job.attempts} attempts")
            self._finish(record, JobState.FAILED, error)
            return
        job.state, job.worker_id, record.assignment_id = JobState.QUEUED, "", ""
        self.metrics.requeued(record)
        self.tracing.requeued(record, message)
        record.enqueued_at = time.monotonic()
        self.queue.push(record, self._batch_key(record))
        record.append(
            JobEvent(
                job_id=job.id,
                kind=EventKind.STATE,
                state=JobState.QUEUED,
                error=JobError("UNAVAILABLE", message),
            )
        )
        self.wake.set()

    def _finish(self, record: JobRecord, state: JobState, error: JobError | None = None) -> None:
        if self.live.pop(record.job.id, None) is not None:  # once per job: it was active till now
            tenant = record.job.tenant
            left = self._active.get(tenant, 0) - 1
            if left > 0:
                self._active[tenant] = left
            else:
                self._active.pop(tenant, None)
        self.store.finish(record, state, error=error)
        self.metrics.finished(record)
        self.tracing.finished(record)
        self._freeze_soon(record.job.id)
        log_finished(record.job.id, record.job.tenant, state, error)

    def _freeze_soon(self, job_id: str) -> None:
        """Freeze a finished job once the callbacks already due (its waiters' wake-ups) have run."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the event loop (tests, tools): at once
            self.store.freeze_finished(job_id)
            return
        loop.call_soon(self.store.freeze_finished, job_id)

    def _waiting_reason(self, plan: Plan) -> str:
        backend = pinned_backend(plan)
        serving = self.workers.serving_count(plan.spec, backend)
        return waiting_reason(plan.spec, serving, self.unserved, backend)

    def _with_serving(self, spec: ModelSpec) -> ModelSpec:
        return dataclasses.replace(
            spec, serving_workers=self.workers.serving_count(spec), warm_on=self.model_loads.warm_on(spec)
        )

    def _batch_key(self, record: JobRecord) -> Hashable | None:
        return batch_key(record.plan, batch_limit(self.config, record.plan.spec))

    def expire(self, record: JobRecord, error: JobError | None = None) -> None:
        """Fail a job whose deadline passed (or with `error`); a running one is told to stop at
        its next step."""
        job = record.job
        if job.state is JobState.RUNNING:
            with contextlib.suppress(Exception):
                handle = self.workers.get(job.worker_id)
                handle.link.send(CancelAssignment(record.assignment_id, job.id, "DEADLINE_EXCEEDED"))
        self.queue.remove(job.id)
        where = "while running" if job.state is JobState.RUNNING else "while queued"
        error = error or JobError("DEADLINE_EXCEEDED", f"deadline passed {where}")
        self._finish(record, JobState.FAILED, error)
