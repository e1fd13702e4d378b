"""The memory engine's background work: dispatching queued jobs to free workers, and the reaper
(silent workers' leases, deadlines, evicting old finished jobs).

The twin of `engines/redis/upkeep.py`, through the same kind of narrow interface
(`UpkeepEngine`): the loops and the placement of jobs run here, the job transitions they call
for (expire a job, lose a worker) stay the engine's.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
import uuid
from collections.abc import Mapping
from typing import Protocol

from omnirt._internal.protocol.messages import Assignment, AssignmentItem
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.batching import (
    batch_limit,
    holds_back,
    join_room,
    pinned_backend,
    queue_name,
    step_key,
    step_rows,
    window_due,
)
from omnirt.controller.core.jobs import JobRecord, Unserved, utcnow
from omnirt.controller.core.router import WorkerHandle, WorkerRegistry
from omnirt.controller.engines.memory.queue import JobQueue
from omnirt.controller.engines.memory.store import JobStore
from omnirt.controller.observability.metrics import EngineMetrics
from omnirt.controller.observability.tracing import JobTracing
from omnirt.types import EventKind, JobError, JobEvent, JobState

log = logging.getLogger("omnirt.controller")
TICK_S = 0.1
UNSERVED_TICK_S = 1.0  # how often queued jobs of models no worker serves are looked at


class UpkeepEngine(Protocol):
    """What `MemoryUpkeep` needs of its engine (`MemoryEngine` is one), and nothing more."""

    # The parts the upkeep works with: the engine never replaces them, so they are taken once
    # (but the observers, `metrics` and `tracing`, are read when used: tests swap them).
    @property
    def config(self) -> ControllerConfig: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def queue(self) -> JobQueue: ...
    @property
    def workers(self) -> WorkerRegistry: ...
    @property
    def metrics(self) -> EngineMetrics: ...
    @property
    def tracing(self) -> JobTracing: ...
    @property
    def wake(self) -> asyncio.Event: ...
    # The jobs queued or running, and the heap of (deadline_ms, job id) of those with a deadline
    # (the engine pushes, the reaper pops the due ones).
    @property
    def live(self) -> Mapping[str, JobRecord]: ...
    @property
    def deadlines(self) -> list[tuple[int, str]]: ...
    @property
    def unserved(self) -> Unserved: ...

    # The engine's own transitions, which the upkeep's loops call for.
    def expire(self, record: JobRecord, error: JobError | None = None) -> None: ...
    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None: ...


class MemoryUpkeep:
    """The loops a `MemoryEngine` runs while it serves, and the placement of queued jobs."""

    def __init__(self, engine: UpkeepEngine) -> None:
        self.engine = engine
        self.config, self.store, self.queue = engine.config, engine.store, engine.queue
        self.workers, self.wake = engine.workers, engine.wake
        # When a job held back for batch companions must go anyway (monotonic; 0 = none).
        self._window_due = 0.0
        self._unserved_checked = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._dispatch_loop()), asyncio.create_task(self._reaper_loop())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- dispatch -------------------------------------------------------------------------

    def dispatch(self) -> int:
        """Give queued jobs to workers with free slots, or to running step batches they may join;
        returns how many were placed."""
        budget = self.workers.free_slots() + self.workers.join_room()
        if not budget or not len(self.queue):
            return 0
        waiting: list[JobRecord] = []  # the jobs this pass left queued, in order
        return self.queue.take(lambda record: self._place(record, waiting), budget)

    def _place(self, record: JobRecord, waiting: list[JobRecord]) -> bool:
        """Send this job (and queued jobs that can share its call) to the best free worker, or
        alone to a worker whose running step batch it may join."""
        spec = record.plan.spec
        handle = self.workers.pick(spec, pinned_backend(record.plan))
        if handle is None:
            if self._join(record, waiting):
                return True
            waiting.append(record)
            return False
        limit = batch_limit(self.config, spec)
        if self.queue.batchable(record.job.id):
            due = window_due(
                enqueued=record.enqueued_at,
                now=time.monotonic(),
                window=self.config.batch_window_ms / 1000,
                busy_window=self.config.batch_busy_window_ms / 1000,
                model_running=self.workers.running_of(spec.id) > 0,
                peers=self.queue.count_peers(record.job.id),
                limit=limit,
            )
            if due is not None:  # wait a little for companions
                self._window_due = min(self._window_due or due, due)
                return False
        batch = [record, *self.queue.take_peers(record.job.id, limit - 1)]
        self._send(handle, batch)
        return True

    def _join(self, record: JobRecord, waiting: list[JobRecord]) -> bool:
        """Send the job to a worker running a step batch it may join, beside that worker's slots.

        In queue order: not past a job this pass left waiting before it that the worker serves
        and that holds it back (`holds_back`: of higher priority, or another tenant's). Queued jobs
        that may share its pipeline call (its batch key) go with it, as many as the batch has room
        for (`join_room`) within the batch limit: one call of theirs instead of one each.
        """
        key = step_key(record.plan)
        if key is None:
            return False
        rows = step_rows(record.plan)
        handle = self.workers.pick_join(record.plan.spec, key, rows)
        if handle is None:
            return False
        job = record.job
        for ahead in waiting:
            if handle.serves(ahead.plan.spec, pinned_backend(ahead.plan)) and holds_back(
                ahead.job.priority, ahead.job.tenant, job.priority, job.tenant
            ):
                return False
        # Queued jobs that share its call join with it, as one call, while the batch has room.
        room = join_room(handle.info.step_rows, handle.step_running(key), rows)
        limit = min(batch_limit(self.config, record.plan.spec), room)
        peers = self.queue.take_peers(record.job.id, limit - 1) if self.queue.batchable(record.job.id) else []
        self._send(handle, [record, *peers], joins_batch=True)
        return True

    def _send(self, handle: WorkerHandle, batch: list[JobRecord], joins_batch: bool = False) -> None:
        """Start `batch` (one job, or jobs that share a call) on `handle` as one assignment."""
        record = batch[0]
        assignment_id = "asg-" + uuid.uuid4().hex[:16]
        items = [self._start(r, handle, assignment_id, joins_batch) for r in batch]
        now = time.monotonic()
        for r in batch:
            r.dispatched_at, r.batch_size = now, len(batch)
        self.engine.metrics.dispatched(batch)
        self.engine.tracing.dispatched(batch, handle.id, assignment_id)
        handle.link.send(
            Assignment(
                assignment_id,
                model=record.plan.spec,
                items=items,
                # A batch carries each job's own deadline in its request.
                deadline_ms=record.job.deadline_ms if len(batch) == 1 else 0,
                trace_context=self.engine.tracing.assignment_context(batch),
                batch_group_id=("bat-" + uuid.uuid4().hex[:12]) if len(batch) > 1 else "",
                joins_batch=joins_batch,
            )
        )

    def _start(
        self, record: JobRecord, handle: WorkerHandle, assignment_id: str, joins_batch: bool = False
    ) -> AssignmentItem:
        """Mark one job RUNNING on `handle` under `assignment_id`."""
        job = record.job
        job.state = JobState.RUNNING
        job.started_at = utcnow()
        job.attempts += 1
        job.worker_id = handle.id
        job.waiting_reason = ""
        record.assignment_id = assignment_id
        handle.start(job.id, assignment_id, record.plan.spec.id, handle.step_of(record.plan), joins_batch)
        wait_ms = (time.monotonic() - record.enqueued_at) * 1000
        record.append(
            JobEvent(
                job_id=job.id,
                kind=EventKind.STATE,
                state=JobState.RUNNING,
                worker_id=handle.id,
                attempt=job.attempts,
            )
        )
        return AssignmentItem(job.id, record.plan.request, job.attempts, wait_ms, record.request_encoded)

    async def _dispatch_loop(self) -> None:
        while True:
            timeout = max(0.0, self._window_due - time.monotonic()) if self._window_due else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: see jobs.py
                    await self.wake.wait()
            self.wake.clear()
            self._window_due = 0.0
            try:
                self.dispatch()
            except Exception:  # a bug here must not stop dispatching for everyone
                log.exception("dispatch failed")

    # ---- the reaper -----------------------------------------------------------------------

    async def reap(self) -> None:
        """Expire leases of silent workers, fail jobs past their deadline, evict old jobs."""
        now = time.monotonic()
        lease_s = self.config.lease_timeout_ms / 1000
        for handle in self.workers.all():
            if now - handle.last_seen > lease_s:
                handle.link.close()
                await self.engine.worker_lost(handle, f"no heartbeat for {lease_s:.1f} s")
        now_ms = int(time.time() * 1000)
        live, deadlines = self.engine.live, self.engine.deadlines
        if len(deadlines) > 2 * len(live) + 1024:  # mostly jobs that finished in time
            deadlines[:] = [(r.job.deadline_ms, i) for i, r in live.items() if r.job.deadline_ms]
            heapq.heapify(deadlines)
        while deadlines and deadlines[0][0] <= now_ms:
            _, job_id = heapq.heappop(deadlines)
            record = live.get(job_id)  # gone when it finished in time
            if record is not None:
                self.engine.expire(record)
        if now - self._unserved_checked >= UNSERVED_TICK_S:
            self._unserved_checked = now
            self._fail_unserved(now)
        self.store.evict()

    def _fail_unserved(self, now: float) -> None:
        """Fail the queued jobs that waited out --unserved-wait-s with no worker for their model."""
        rule = self.engine.unserved
        if rule.wait_s <= 0:
            return
        unserved: dict[str, float] = {}  # by queue: a model's, or its jobs' pinned to a backend
        for record in list(self.queue.records()):
            spec, backend = record.plan.spec, pinned_backend(record.plan)
            name = queue_name(spec.id, backend)
            if name not in unserved:
                unserved[name] = rule.observe(name, self.workers.serving_count(spec, backend), now)
            error = rule.error(spec.id, now - record.first_enqueued_at, unserved[name], backend)
            if error is not None:
                self.engine.expire(record, error)
        rule.keep_only(unserved)  # a model no job waits for any more starts afresh next time

    async def _reaper_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.reap()
            except Exception:
                log.exception("reaper failed")
