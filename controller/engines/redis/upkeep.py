"""The Redis engine's background work: dispatching to this controller's workers, renewing and
expiring leases, deadlines, readiness, the cluster view, and the notifications of other controllers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol

import redis.exceptions

from omnirt._internal.protocol.messages import Assignment, AssignmentItem
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.batching import batch_key_id, batch_limit, queue_name, split_queue
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.jobs import JobRecord, Unserved, utcnow
from omnirt.controller.core.router import WorkerHandle, WorkerRegistry
from omnirt.controller.core.validation import Plan
from omnirt.controller.engines.redis.cluster import Cluster
from omnirt.controller.engines.redis.run_events import RunEventBuffer
from omnirt.controller.engines.redis.store import Claimed, RedisJobStore
from omnirt.controller.engines.redis.waiters import Waiters, raise_lost_cancel
from omnirt.controller.observability.metrics import EngineMetrics, Gauges
from omnirt.controller.observability.tracing import JobTracing
from omnirt.errors import OmniRTError
from omnirt.types import EventKind, Job, JobError, JobEvent, JobState, ModelSpec

log = logging.getLogger("omnirt.controller")
TICK_S = 0.1
# How often the dispatcher looks at the queue without being woken (a lost notification).
POLL_S = 0.5
SLOW_TICK_S = 1.0  # also renews worker-id claims: see Cluster.claim_ms
ARTIFACT_SWEEP_S = 60.0
SWEEP_PAGE = 500
TIDY_S = 5.0  # how often the fair-share tags, tenants' active sets and listings are tidied


# How long a controller's count of its running jobs stays in the cluster's gauge after it wrote
# it (once a second): a controller that stopped leaves the sum within this.
GAUGE_KEEP_MS = 5000


def _now_ms() -> int:
    return int(time.time() * 1000)


class UpkeepEngine(Protocol):
    """What `RedisUpkeep` needs of its engine (`RedisEngine` is one), and nothing more."""

    # The parts the upkeep works with: the engine never replaces them, so they are taken once.
    @property
    def id(self) -> str: ...
    @property
    def config(self) -> ControllerConfig: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def store(self) -> RedisJobStore: ...
    @property
    def workers(self) -> WorkerRegistry: ...
    @property
    def metrics(self) -> EngineMetrics: ...
    @property
    def tracing(self) -> JobTracing: ...
    @property
    def wake(self) -> asyncio.Event: ...
    @property
    def cluster(self) -> Cluster: ...
    # The jobs this controller takes part in, those running on its workers, the tasks waiting
    # on jobs, and the worker results kept while Redis was away.
    @property
    def records(self) -> dict[str, JobRecord]: ...
    @property
    def running(self) -> dict[str, JobRecord]: ...
    @property
    def waiters(self) -> Waiters: ...
    @property
    def pending(self) -> list[Callable[[], Awaitable[None]]]: ...

    @property
    def unserved(self) -> Unserved: ...
    @property
    def pinned_queues(self) -> set[str]: ...
    @property
    def run_events(self) -> RunEventBuffer: ...

    # What the upkeep finds out for the engine: readiness and the cluster's gauges.
    store_ok: bool
    depth: Gauges

    # The engine's own transitions, which the upkeep's loops call for.
    def stop_local(self, job_id: str, assignment_id: str, reason: str) -> None: ...
    def closed(self, job_id: str, state: JobState, error: JobError | None) -> None: ...
    async def requeue(
        self, job_id: str, assignment_id: str, message: str, lease_before_ms: int = 0
    ) -> None: ...
    async def end(
        self, job_id: str, state: JobState, error: JobError, *, expected: tuple[JobState, ...] = ...
    ) -> tuple[Job, bool]: ...
    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None: ...


class RedisUpkeep:
    """The loops a `RedisEngine` runs while it serves."""

    def __init__(self, engine: UpkeepEngine) -> None:
        self.engine = engine
        self.controller_id, self.config, self.catalog = engine.id, engine.config, engine.catalog
        self.store, self.workers, self.wake = engine.store, engine.workers, engine.wake
        self.cluster, self.waiters = engine.cluster, engine.waiters
        self.metrics, self.tracing = engine.metrics, engine.tracing
        self.records, self.running, self.pending = engine.records, engine.running, engine.pending
        # When a job held back for batch companions must go anyway (monotonic; 0 = none).
        self._window_due = 0.0
        # The queues a claim found empty since a job was last queued anywhere ("q", or a submit
        # or requeue here; every POLL_S without a wake-up forgets them too, in case a
        # notification was lost): a slot that frees does not claim from them again.
        self._empty: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        # Where the tidying of each tenant's active set and listing goes on (SSCAN cursor,
        # offset), and when it last ran (monotonic).
        self._active_cursors: dict[str, int] = {}
        self._listing_offsets: dict[str, int] = {}
        self._tidied = 0.0

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._dispatch_loop()),
            asyncio.create_task(self._reaper_loop()),
            asyncio.create_task(self._slow_loop()),
            asyncio.create_task(self._listen()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- dispatch -------------------------------------------------------------------------

    def _running(self, queues: dict[str, int]) -> set[str]:
        """The queues whose model has jobs running: on this controller's workers now, or on any
        controller's as of the last gauge (the busy batch window's test; no read of Redis)."""
        if self.config.batch_busy_window_ms <= self.config.batch_window_ms:
            return set()
        cluster = self.engine.depth.running_by_model
        running = set()
        for queue in queues:
            model = split_queue(queue)[0]
            if self.workers.running_of(model) or cluster.get(model):
                running.add(queue)
        return running

    async def dispatch(self) -> int:
        """Give queued jobs to this controller's workers with free slots; returns the calls placed."""
        placed = 0
        waiting: set[str] = set()
        while True:
            models = self._queues(waiting | self._empty)
            if not models:
                return placed + await self._join()
            assignment_id = "asg-" + uuid.uuid4().hex[:16]
            claim = await self.store.claim(
                models,
                self.controller_id,
                assignment_id,
                self.config.lease_timeout_ms,
                self.config.batch_window_ms,
                _now_ms(),
                busy_window_ms=self.config.batch_busy_window_ms,
                empty=self._empty,
                running=self._running(models),
            )
            if claim is None:
                self._empty.update(models)
                return placed + await self._join()
            model, claimed = claim
            if isinstance(claimed, int):  # the head waits for batch companions
                waiting.add(model)
                due = time.monotonic() + max(0, claimed - _now_ms()) / 1000
                self._window_due = min(self._window_due or due, due)
                continue
            name, backend = split_queue(model)
            await self._send(self.catalog.resolve(name), assignment_id, claimed, backend=backend)
            placed += 1

    def queued(self) -> None:
        """A job was queued (or queued again): every queue may hold one now."""
        self._empty.clear()
        self.wake.set()

    def _queues(self, waiting: set[str]) -> dict[str, int]:
        """The queues this controller's free workers can take from, with their batch limits: each
        model's with a free worker, and those of its queues of pinned jobs that exist (Redis's
        `pinned` set, read each slow tick, and the ones submitted here) for the backends of those
        workers. A claim looks at each queue it is given: no pinned jobs, no extra look."""
        queues: dict[str, int] = {}
        pinned = self.engine.pinned_queues
        for spec in self._free_specs():
            backends = self.workers.free_backends(spec)
            if not backends:
                continue
            limit = batch_limit(self.config, spec)
            names = [spec.id]
            if pinned:
                names += [q for q in (queue_name(spec.id, b) for b in backends) if q in pinned]
            for name in names:
                if name not in waiting:
                    queues[name] = limit
        return queues

    def _free_specs(self) -> list[ModelSpec]:
        """The models a worker with a free slot may serve: those its Hello listed, or the whole
        catalog when one lists none (it takes any of its mode). The catalog is walked only then:
        a dispatch runs on every freed slot."""
        listed: set[str] = set()
        for handle in self.workers.all():
            if handle.free_slots > 0:
                if not handle.info.models:
                    return list(self.catalog)
                listed.update(handle.info.models)
        specs = []
        for model in sorted(listed):
            with contextlib.suppress(OmniRTError):  # a model the catalog does not have: no queue
                specs.append(self.catalog.resolve(model))
        return specs

    async def _join(self) -> int:
        """Give queued jobs to step batches running on this controller's workers, beside their
        slots (the rule: `core.batching.step_key` and `may_join`, in queue order; see
        scripts.CLAIM_JOIN); returns the jobs placed."""
        placed = 0
        while True:
            joins = self._joinable()
            if not joins:
                return placed
            assignment_id = "asg-" + uuid.uuid4().hex[:16]
            entries = [
                (model, key_id, room, served, batch_limit(self.config, self.catalog.resolve(model)))
                for (model, key_id), (_, _, room, served) in joins.items()
            ]
            claim = await self.store.claim_join(
                entries, self.controller_id, assignment_id, self.config.lease_timeout_ms, _now_ms()
            )
            if claim is None:
                return placed
            model, key_id, claimed = claim
            handle, key, _, _ = joins[(model, key_id)]
            await self._send(self.catalog.resolve(model), assignment_id, claimed, joined=(handle, key))
            placed += 1

    def _joinable(self) -> dict[tuple[str, str], tuple[WorkerHandle, Hashable, int, str]]:
        """(model, step key id) -> (worker, step key, rows it can take, "|models it serves|") of
        the fullest running step batch with room of each key, for the models that none of this
        controller's workers has a free slot for."""
        joins: dict[tuple[str, str], tuple[WorkerHandle, Hashable, int, str]] = {}
        for handle in self.workers.all():
            if not handle.info.step_rows or not handle.row_room:
                continue
            served = ""  # read from the catalog once per worker, and only when it has room
            for key, rows in handle.step_batches().items():
                model = str(key[0]) if isinstance(key, tuple) else ""
                room = handle.info.step_rows - rows
                if not model or room < 2 or self.workers.pick(self.catalog.resolve(model)) is not None:
                    continue
                # The queues it serves: its models' and their jobs' pinned to its backend.
                served = served or "|" + "|".join(self._served(handle)) + "|"
                entry = (model, batch_key_id(key))
                known = joins.get(entry)
                if known is None or known[2] > room:
                    joins[entry] = (handle, key, room, served)
        return joins

    def _served(self, handle: WorkerHandle) -> list[str]:
        specs = [s.id for s in self.catalog if handle.serves(s)]
        return specs + [queue_name(m, handle.info.backend) for m in specs if handle.info.backend]

    async def _send(
        self,
        spec: ModelSpec,
        assignment_id: str,
        claimed: list[Claimed],
        joined: tuple[WorkerHandle, Hashable] | None = None,
        backend: str = "",
    ) -> None:
        handle = joined[0] if joined is not None else self.workers.pick(spec, backend)
        if handle is None:  # the worker went away while we claimed
            for c in claimed:
                await self.engine.requeue(c.job_id, assignment_id, "no worker left to take the job")
            return
        now = _now_ms()
        batch: list[JobRecord] = []
        items = []
        for c in claimed:
            self.tracing.adopt(c.job_id, c.traceparent)  # accepted by another controller
            record = self.records.get(c.job_id)
            if record is None:  # accepted by another controller: read from its bytes
                request = c.request
                job = Job(
                    id=c.job_id, state=JobState.RUNNING, model=spec.id, task=request.task, tenant=c.tenant
                )
                record = JobRecord(job=job, plan=Plan(spec, request))
            job = record.job
            job.state, job.attempts, job.worker_id, job.started_at = (
                JobState.RUNNING,
                c.attempts,
                handle.id,
                utcnow(),
            )
            record.assignment_id = assignment_id
            record.enqueued_at = time.monotonic() - max(0, now - c.enqueued_ms) / 1000
            # What the run-time estimate learns from when the result comes (see tenants.RunTimes).
            record.dispatched_at, record.batch_size = time.monotonic(), len(claimed)
            handle.start(c.job_id, assignment_id, spec.id, handle.step_of(record.plan), joined is not None)
            self.running[c.job_id] = record
            batch.append(record)
            items.append(
                AssignmentItem(
                    c.job_id,
                    record.plan.request,
                    c.attempts,
                    max(0.0, float(now - c.enqueued_ms)),
                    encoded_request=c.request_encoded,
                )
            )
        for r in batch:  # written with the run's first events, or with its result
            running = JobEvent(
                job_id=r.job.id,
                kind=EventKind.STATE,
                state=JobState.RUNNING,
                worker_id=handle.id,
                attempt=r.job.attempts,
            )
            self.engine.run_events.add(r.job.id, assignment_id, running, worker=handle.id)
        self.metrics.dispatched(batch)
        self.tracing.dispatched(batch, handle.id, assignment_id)
        handle.link.send(
            Assignment(
                assignment_id,
                spec,
                items,
                deadline_ms=batch[0].plan.request.deadline_ms if len(batch) == 1 else 0,
                trace_context=self.tracing.assignment_context(batch),
                batch_group_id=("bat-" + uuid.uuid4().hex[:12]) if len(claimed) > 1 else "",
                joins_batch=joined is not None,
            )
        )

    async def _dispatch_loop(self) -> None:
        while True:
            raise_lost_cancel()  # stopping: a cancel a Redis call swallowed (see redis_store)
            timeout = max(0.0, self._window_due - time.monotonic()) if self._window_due else POLL_S
            try:
                async with asyncio.timeout(timeout):  # not wait_for: see jobs.py
                    await self.wake.wait()
            except TimeoutError:
                self._empty.clear()
            self.wake.clear()
            self._window_due = 0.0
            try:
                await self.dispatch()
            except redis.exceptions.RedisError as exc:
                self.engine.store_ok = False
                log.debug("dispatch: job store unavailable: %s", exc)
            except Exception:
                log.exception("dispatch failed")

    # ---- background upkeep -----------------------------------------------------------------

    async def _reaper_loop(self) -> None:
        last_renew = 0.0
        while True:
            raise_lost_cancel()
            await asyncio.sleep(TICK_S)
            try:
                self._reap_workers()
                if not await self._retry_pending():
                    continue
                now = time.monotonic()
                if now - last_renew >= self.config.lease_timeout_ms / 3000:
                    last_renew = now
                    await self._renew_leases()
                await self._expire_leases()
                await self._expire_deadlines()
            except redis.exceptions.RedisError as exc:
                self.engine.store_ok = False
                log.debug("reaper: job store unavailable: %s", exc)
            except Exception:
                log.exception("reaper failed")

    async def _renew_leases(self) -> None:
        """Renew the leases of jobs our workers run; requeue any we hold for no worker (never stuck)."""
        held, orphans = [], []
        for job_id, record in list(self.running.items()):
            try:
                handle = self.workers.get(record.job.worker_id)
            except OmniRTError:
                handle = None
            if handle is not None and handle.running.get(job_id) == record.assignment_id:
                held.append(job_id)
            else:
                orphans.append((job_id, record.assignment_id))
        await self.store.renew(self.controller_id, held, _now_ms() + self.config.lease_timeout_ms)
        for job_id, assignment_id in orphans:
            log.warning("job held for no connected worker: requeued", extra={"job_id": job_id})
            await self.engine.requeue(job_id, assignment_id, "its worker is no longer connected")

    def _reap_workers(self) -> None:
        lease_s = self.config.lease_timeout_ms / 1000
        now = time.monotonic()
        for handle in self.workers.all():
            if now - handle.last_seen > lease_s:
                handle.link.close()
                task = asyncio.create_task(
                    self.engine.worker_lost(handle, f"no heartbeat for {lease_s:.1f} s")
                )
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    async def _retry_pending(self) -> bool:
        """Store results kept while Redis was away; False while it still is."""
        while self.pending:
            try:
                await self.pending[0]()
            except redis.exceptions.RedisError:
                return False
            self.pending.pop(0)
        return True

    async def _expire_leases(self) -> None:
        now = _now_ms()
        for job_id in await self.store.expired_leases(now):
            if job_id in self.running:
                continue  # ours: renewed on the next tick
            await self.engine.requeue(
                job_id, "", "the controller holding the job stopped renewing its lease", now
            )

    async def _expire_deadlines(self) -> None:
        for job_id in await self.store.due_deadlines(_now_ms()):
            try:
                stored = await self.store.load(job_id)
            except OmniRTError:  # expired or evicted: its entry is all that is left
                await self.store.drop_deadline(job_id)
                continue
            if stored.job.state.terminal:  # ended without taking its entry along
                await self.store.drop_deadline(job_id)
                continue
            where = "while running" if stored.job.state is JobState.RUNNING else "while queued"
            with contextlib.suppress(OmniRTError):
                await self.engine.end(
                    job_id, JobState.FAILED, JobError("DEADLINE_EXCEEDED", f"deadline passed {where}")
                )

    async def _slow_loop(self) -> None:
        """Once a second: readiness, this controller's workers into Redis, the cluster's gauges."""
        last_sweep = 0.0
        while True:
            raise_lost_cancel()
            try:
                await self.store.ping()
                if not self.engine.store_ok:
                    log.warning("job store reachable again: %s", self.config.store)
                    self.wake.set()
                    self.waiters.notify_all()
                self.engine.store_ok = True
                # This controller's workers into the cluster's view, and their ids' claims renewed.
                await self.cluster.publish()
                self.engine.depth = await self.store.gauges.read(
                    [spec.id for spec in self.catalog],
                    self.controller_id,
                    self.workers.running_by_model(),
                    _now_ms(),
                    GAUGE_KEEP_MS,
                )
                self.engine.pinned_queues.update(q for q in self.engine.depth.queued_by_queue if "@" in q)
                await self._sweep_records()
                await self._fail_unserved()
                if time.monotonic() - last_sweep > ARTIFACT_SWEEP_S:
                    last_sweep = time.monotonic()
                    await asyncio.to_thread(self.store.artifacts.sweep, time.time())
                await self._tidy()
            except redis.exceptions.RedisError as exc:
                if self.engine.store_ok:
                    log.warning("job store unreachable: %s", exc)
                self.engine.store_ok = False
            except Exception:
                log.exception("upkeep failed")
            await asyncio.sleep(SLOW_TICK_S)

    async def _fail_unserved(self) -> None:
        """Fail the queued jobs that waited out --unserved-wait-s with no worker for their model
        on any controller (each controller looks; the first to end a job wins, atomically)."""
        rule = self.engine.unserved
        if rule.wait_s <= 0:
            return
        now, now_ms = time.monotonic(), _now_ms()
        queued = [q for q, n in self.engine.depth.queued_by_queue.items() if n]
        rule.keep_only(queued)
        for queue in queued:  # a model's, or its jobs' pinned to a backend
            model, backend = split_queue(queue)
            try:
                serving = self.cluster.serving(self.catalog.resolve(model), backend)
            except OmniRTError:  # a model the catalog no longer has: its jobs are not ours to judge
                continue
            unserved_s = rule.observe(queue, serving, now)
            if rule.error(model, unserved_s, unserved_s, backend) is None:
                continue
            for job_id in await self.store.queued_of(queue):
                with contextlib.suppress(OmniRTError):  # gone meanwhile
                    stored = await self.store.load(job_id)
                    created = stored.job.created_at
                    waited_s = now_ms / 1000 - created.timestamp() if created else unserved_s
                    error = rule.error(model, waited_s, unserved_s, backend)
                    if error is not None:
                        await self.engine.end(job_id, JobState.FAILED, error, expected=(JobState.QUEUED,))

    async def _tidy(self) -> None:
        """Every few seconds: drop fair-share tags that hold no one back, and what expired or
        was evicted from the tenants' active sets and listings (normally each job leaves them
        in the script that ends it or as a listing meets it; this bounds what slips by)."""
        if time.monotonic() - self._tidied < TIDY_S:
            return
        self._tidied = time.monotonic()
        store = self.store
        now = _now_ms()
        await store.prune_fair(now / 1000)
        created_before = now - store.ttl_s * 1000  # a younger job cannot have expired yet
        for tenant in await store.tenants():
            cursor = self._active_cursors.get(tenant, 0)
            self._active_cursors[tenant], _ = await store.sweep_active(tenant, cursor, SWEEP_PAGE)
            offset = self._listing_offsets.get(tenant, 0)
            self._listing_offsets[tenant], _ = await store.sweep_listing(
                tenant, created_before, offset, SWEEP_PAGE
            )

    async def _sweep_records(self) -> None:
        """Forget jobs submitted here that finished elsewhere (the observers see them end)."""
        ids = [job_id for job_id in self.records if job_id not in self.running]
        for start in range(0, len(ids), SWEEP_PAGE):
            page = ids[start : start + SWEEP_PAGE]
            for job_id, state in zip(page, await self.store.states(page), strict=True):
                if state is None or state.terminal:
                    record = self.records.get(job_id)
                    error = record.job.error if record else None
                    self.engine.closed(job_id, state or JobState.FAILED, error)

    async def _listen(self) -> None:
        """Notifications from every controller: queued jobs, new events, stops and drains."""
        while True:
            raise_lost_cancel()
            pubsub = self.store.redis.pubsub()
            try:
                await pubsub.subscribe(self.store.channel)
                # Catch up on whatever was missed while not subscribed.
                self.queued()
                self.waiters.notify_all()
                async for message in pubsub.listen():
                    raise_lost_cancel()
                    if message.get("type") == "message":
                        self._on_message(message["data"].decode())
            except redis.exceptions.RedisError:
                self.engine.store_ok = False
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    def _on_message(self, text: str) -> None:
        kind, _, rest = text.partition(" ")
        if kind == "q":
            self.queued()
        elif kind == "e":
            self.waiters.notify(rest)
        elif kind == "E":  # the final states of several jobs, one FINISH call's
            for job_id in rest.split(" "):
                self.waiters.notify(job_id)
        elif kind == "p":  # only new events of its run: watchers look, `wait` sleeps on
            self.waiters.notify(rest, state=False)
        elif kind == "c":
            job_id, assignment_id, owner, reason = [*rest.split(" "), "", "", ""][:4]
            if owner == self.controller_id:
                self.engine.stop_local(job_id, assignment_id, reason or "CANCELLED")
        elif kind == "d":
            with contextlib.suppress(OmniRTError):
                self.workers.get(rest).drain()
