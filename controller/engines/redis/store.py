"""`RedisJobStore`: jobs, the queue, leases and event logs in Redis (see `scripts.py` for keys).

This module only stores and loads: protos in, dataclasses out, one Lua script per state change.
What to do with a job (dispatch, retry, expire) is `RedisEngine`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Container, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from omnirt._internal import catalog_convert
from omnirt._internal import convert as c
from omnirt.controller.core.batching import split_queue
from omnirt.controller.core.tenants import UNLIMITED, TenantPolicy, bucket_size
from omnirt.controller.engines.redis import event_log, scripts, upkeep_scripts
from omnirt.controller.engines.redis.artifacts import ArtifactFiles
from omnirt.controller.engines.redis.coalesced import Coalesced, many
from omnirt.controller.engines.redis.connection import connect
from omnirt.controller.engines.redis.gauges import GaugeReader
from omnirt.controller.engines.redis.records import Finished, QuotaRefusal, RunEvents, StoredJob
from omnirt.errors import JobNotFound, QueueFull
from omnirt.types import (
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    WorkerInfo,
)
from omnirt.v1 import cluster_pb2, types_pb2

PREFIX = "{omnirt}:"
LIST_PAGE = 256


def _ms_to_dt(value: bytes | None) -> datetime | None:
    return datetime.fromtimestamp(int(value) / 1000, UTC) if value else None


def _bytes(msg: Any) -> bytes:
    return bytes(msg.SerializeToString()) if msg is not None else b""


def job_not_found(job_id: str) -> JobNotFound:
    """What an unknown id gets, and as well a known one of another tenant (no existence oracle)."""
    return JobNotFound(f"job {job_id!r} not found (unknown or expired)", field="job_id")


@dataclass
class Claimed:
    """One job a claim marked RUNNING, with its resolved request as stored (encoded once, at
    submit): it goes to the worker as these bytes, and is read only for a job this controller
    does not hold (`request`)."""

    job_id: str
    attempts: int
    request_encoded: bytes
    enqueued_ms: int
    traceparent: str = ""  # of the job's span on the controller that accepted it
    tenant: str = ""

    @property
    def request(self) -> GenerateRequest:
        """The request, read from its bytes."""
        return c.request_from_bytes(self.request_encoded)


def _claimed(r: Sequence[bytes]) -> list[Claimed]:
    """The jobs of a claim's answer: id, attempts, request, enqueued_ms, traceparent, tenant each."""
    return [
        Claimed(r[i].decode(), int(r[i + 1]), r[i + 2], int(r[i + 3]), r[i + 4].decode(), r[i + 5].decode())
        for i in range(0, len(r), 6)
    ]


class RedisJobStore:
    """Typed access to the keys of `scripts.py` over one `redis.asyncio` client."""

    def __init__(
        self,
        url: str,
        *,
        job_ttl_s: float,
        idempotency_ttl_s: float,
        artifact_limit_bytes: int,
        artifact_dir: str,
        prefix: str = PREFIX,
    ) -> None:
        self.url = url
        # Any: redis-py's reply types are unions of every decode mode; the replies here are bytes.
        # A restarted Redis leaves every pooled connection dead: a command that meets one is
        # retried once on a fresh connection (the scripts tolerate running twice; see SUBMIT).
        # socket_timeout makes redis-py send each command under asyncio.wait_for: see
        # `raise_lost_cancel` for what that means on Python 3.11.
        self.redis: Any = connect(
            url,
            socket_connect_timeout=2,
            socket_timeout=5,
            health_check_interval=5,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.01), 1),
            retry_on_error=[redis.exceptions.ConnectionError],
        )
        self.prefix = prefix
        self.gauges = GaugeReader(self.redis, prefix)
        self.channel = prefix + "notify"
        self.ttl_s = max(1, int(job_ttl_s))
        self.idempotency_ttl_s = max(1, int(idempotency_ttl_s))
        self.artifacts = ArtifactFiles(artifact_dir, artifact_limit_bytes, self.ttl_s)
        self._scripts = {
            name: self.redis.register_script(scripts.PRELUDE + getattr(scripts, name))
            for name in ("CLAIM", "CLAIM_JOIN", "APPEND_MANY", "REQUEUE", "RENEW")
        }
        self._scripts["SUBMIT"] = self.redis.register_script(
            scripts.PRELUDE + scripts.QUOTAS + many(scripts.SUBMIT)
        )
        self._scripts["FINISH"] = self.redis.register_script(
            scripts.PRELUDE + many(scripts.FINISH, "told = {}\n", "tell_finals(ARGV[1])")
        )
        # Concurrent submits and results go several to a call (a group commit).
        self._submits = Coalesced(lambda args: self._run("SUBMIT", *args))
        self._finishes = Coalesced(lambda args: self._run("FINISH", *args))
        # The scripts that need none of the PRELUDE's functions: workers' claims, the tidying.
        self._plain_scripts = {
            name: self.redis.register_script(getattr(upkeep_scripts, name))
            for name in (
                "CLAIM_WORKER",
                "WORKERS_SEEN",
                "DROP_WORKER",
                "SWEEP_LISTING",
                "SWEEP_ACTIVE",
                "PRUNE_FAIR",
            )
        }

    async def close(self) -> None:
        await asyncio.gather(self._submits.close(), self._finishes.close())  # none left in flight
        await self.redis.aclose()

    async def _run(self, name: str, *args: Any) -> Any:
        return await self._scripts[name](keys=[], args=[self.prefix, *args])

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    # ---- jobs ---------------------------------------------------------------------------

    async def submit(
        self,
        job: Job,
        request: GenerateRequest,
        fingerprint: bytes,
        batch_key: str,
        rank: float,
        max_queue: int,
        queued: JobEvent,
        traceparent: str = "",
        *,
        policy: TenantPolicy = UNLIMITED,
        cost_s: float = 1.0,
        aging_s: float = 0.0,
        step_key: str = "",
        step_rows: int = 0,
        queue: str = "",
    ) -> str | None:
        """Store and queue a new job of `job.tenant`; returns the id of an existing job of that
        tenant with the same idempotency key, else None.

        `queue` is the queue it waits in (`core.batching.queue_name`; default its model's), which
        the job hash's `model` field holds for the scripts.

        `rank` is the job's for the tenant ""; a named tenant's is computed in Redis from its
        fair-share clock, `cost_s` (the model's expected run time per job) and `policy.weight`.
        Raises QueueFull, or QuotaRefusal when `policy` refuses the job.
        """
        now_ms = int(job.created_at.timestamp() * 1000) if job.created_at else 0
        rate = policy.rate_per_s
        answer = await self._submits.call(
            job.id,
            job.idempotency_key,
            self.idempotency_ttl_s,
            max_queue,
            _bytes(c.job_to_proto(job)),
            _bytes(c.request_to_proto(request)),
            fingerprint,
            queue or job.model,
            batch_key,
            repr(rank),
            now_ms,
            job.deadline_ms,
            job.priority,
            _bytes(c.event_to_proto(queued)),
            traceparent,
            job.tenant,
            policy.max_queued,
            repr(rate),
            bucket_size(policy) if rate > 0 else 0,
            repr(cost_s),
            repr(policy.weight),
            repr(aging_s),
            step_key,
            step_rows,
        )
        kind = answer[0].decode()
        if kind == "dup":
            return str(answer[1].decode())
        if kind == "full":
            raise QueueFull(f"queue is full ({max_queue} jobs waiting); retry later", retry_after_s=1.0)
        if kind == "quota":
            reason = answer[1].decode()
            if reason == "rate":
                raise QuotaRefusal(reason, wait_s=float(answer[2]))
            raise QuotaRefusal(reason, active=int(answer[2]))
        return None

    async def load(self, job_id: str, tenant: str | None = None) -> StoredJob:
        """The job; with `tenant`, JobNotFound unless it is that tenant's (as for an unknown id)."""
        fields: dict[bytes, bytes] = await self.redis.hgetall(self.prefix + "job:" + job_id)
        if not fields or b"static" not in fields:
            raise job_not_found(job_id)
        if tenant is not None and fields.get(b"tenant", b"").decode() != tenant:
            raise job_not_found(job_id)
        return self._decode(fields)

    def _decode(self, f: dict[bytes, bytes]) -> StoredJob:
        job = c.job_from_proto(types_pb2.Job.FromString(f[b"static"]))
        job.tenant = f.get(b"tenant", b"").decode()  # the same as in `static`; older jobs have neither
        job.state = JobState[f[b"state"].decode()]
        job.attempts = int(f.get(b"attempts", b"0"))
        job.worker_id = f.get(b"worker", b"").decode()
        job.started_at = _ms_to_dt(f.get(b"started_ms"))
        job.finished_at = _ms_to_dt(f.get(b"finished_ms"))
        if b"error" in f:
            job.error = c.error_from_proto(types_pb2.JobError.FromString(f[b"error"]))
        if b"progress" in f:
            job.progress = c.progress_from_proto(types_pb2.Progress.FromString(f[b"progress"]))
        if b"result" in f:
            job.result = c.result_from_proto(types_pb2.GenerateResult.FromString(f[b"result"]))
        return StoredJob(
            job=job,
            request_encoded=f[b"request"],
            fingerprint=f.get(b"fingerprint", b""),
            assignment=f.get(b"assignment", b"").decode(),
            owner=f.get(b"owner", b"").decode(),
            enqueued_ms=int(f.get(b"enqueued_ms", b"0")),
            fields=f,
        )

    async def state(self, job_id: str) -> JobState | None:
        value = await self.redis.hget(self.prefix + "job:" + job_id, "state")
        return JobState[value.decode()] if value else None

    async def states(self, job_ids: Sequence[str]) -> list[JobState | None]:
        """The states of several jobs in one round trip (None: unknown or expired)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id in job_ids:
                pipe.hget(self.prefix + "job:" + job_id, "state")
            values = await pipe.execute()
        return [JobState[v.decode()] if v else None for v in values]

    async def position(self, job_id: str) -> int:
        rank = await self.redis.zrank(self.prefix + "queue", job_id)
        return int(rank or 0)

    async def queued_of(self, model: str, count: int = 200) -> list[str]:
        """The first `count` queued jobs of `model`, in queue order."""
        ids = await self.redis.zrange(self.prefix + "queue:m:" + model, 0, count - 1)
        return [i.decode() for i in ids]

    async def list_ids(
        self, states: Sequence[JobState], model: str, limit: int, offset: int, tenant: str | None = None
    ) -> tuple[list[str], bool]:
        """Job ids newest first, filtered (`tenant`: only that tenant's, from its own listing, so
        a tenant's page costs the same however many jobs the others have); returns the page and
        whether more follow."""
        wanted = {s.name.encode() for s in states}
        listing = self.listing_key(tenant)
        picked: list[str] = []
        skipped, start = 0, 0
        while len(picked) <= limit:
            ids = await self.redis.zrevrange(self.prefix + listing, start, start + LIST_PAGE - 1)
            if not ids:
                break
            start += len(ids)
            async with self.redis.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(self.prefix + "job:" + job_id.decode(), "state", "model", "tenant")
                rows = await pipe.execute()
            gone = [job_id for job_id, (state, *_) in zip(ids, rows, strict=True) if state is None]
            if gone:  # expired jobs leave the listing
                await self.redis.zrem(self.prefix + listing, *gone)
                start -= len(gone)
            for job_id, (state, job_model, job_tenant) in zip(ids, rows, strict=True):
                if (
                    state is None
                    or (wanted and state not in wanted)
                    or (model and split_queue(job_model.decode())[0] != model)
                    or (tenant is not None and (job_tenant or b"").decode() != tenant)
                ):
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                picked.append(job_id.decode())
        return picked[:limit], len(picked) > limit

    @staticmethod
    def listing_key(tenant: str | None) -> str:
        """The listing zset (without the prefix) that holds `tenant`'s jobs (None or "": all)."""
        return "jobs:t:" + tenant if tenant else "jobs"

    async def events(self, job_id: str, after: int, count: int = 512) -> list[JobEvent]:
        """Events with a sequence above `after`, from up to `count` stream entries (the entry id
        0-N is the sequence N of its last event: `event_log`)."""
        entries = await self.redis.xrange(self.prefix + "events:" + job_id, f"(0-{after}", "+", count=count)

        async def job_result() -> bytes | None:
            value: bytes | None = await self.redis.hget(self.prefix + "job:" + job_id, "result")
            return value

        return await event_log.read_entries(entries, after, job_result)

    # ---- state changes ------------------------------------------------------------------

    async def claim(
        self,
        models: dict[str, int],
        owner: str,
        assignment_id: str,
        lease_ms: int,
        window_ms: int,
        now_ms: int,
        busy_window_ms: int = 0,
        empty: set[str] | None = None,
        running: Container[str] = (),
    ) -> tuple[str, list[Claimed]] | tuple[str, int] | None:
        """Claim the best queued job of `models` (model -> batch limit) and its batch peers.

        A batchable head with fewer peers than its limit waits for companions `window_ms` after
        it was queued, or `busy_window_ms` when that is longer and jobs of its model run (the
        models in `running`: the caller knows them, its workers' and the cluster's gauge).
        Returns (model, claimed jobs), or (model, due_ms) when the head waits, or None when none
        of the models has a queued job. A claim adds to `empty` those of `models` whose queues
        it left empty.
        """
        triples = [
            x for model, limit in models.items() for x in (model, limit, "1" if model in running else "0")
        ]
        answer = await self._run(
            "CLAIM", now_ms, lease_ms, owner, assignment_id, window_ms, busy_window_ms, *triples
        )
        if not answer:
            return None
        model = answer[1].decode()
        if answer[0] == b"wait":
            return model, int(answer[2])
        if empty is not None and answer[2]:
            empty.update(answer[2].decode().split("\n"))
        return model, _claimed(answer[3:])

    async def claim_join(
        self,
        joins: Sequence[tuple[str, str, int, str, int]],
        owner: str,
        assignment_id: str,
        lease_ms: int,
        now_ms: int,
        depth: int = 64,
    ) -> tuple[str, str, list[Claimed]] | None:
        """Claim the best queued job that may join a running step batch, and its call's companions
        (scripts.CLAIM_JOIN): `joins` holds (model, step key id, rows it can take, "|models the
        worker serves|", batch limit) per batch. Returns (model, step key id, the claimed jobs)."""
        args = [x for join in joins for x in join]
        answer = await self._run("CLAIM_JOIN", now_ms, lease_ms, owner, assignment_id, depth, *args)
        if not answer:
            return None
        return answer[1].decode(), answer[2].decode(), _claimed(answer[3:])

    async def append_many(self, runs: Sequence[RunEvents]) -> int:
        """Log the events of several running jobs in one script (each job's dropped unless its
        assignment still holds it); returns how many jobs' events were logged."""
        args: list[Any] = []
        for run in runs:
            progress = _bytes(c.progress_to_proto(run.progress)) if run.progress else b""
            args += [run.job_id, run.assignment_id, progress, run.worker, *event_log.pack(run.events).args]
        return int(await self._run("APPEND_MANY", *args)) if args else 0

    async def finish(
        self,
        job_id: str,
        state: JobState,
        *,
        expected: Sequence[JobState],
        assignment_id: str = "",
        error: JobError | None = None,
        result: GenerateResult | None = None,
        encoded_result: bytes | None = None,
        state_event: JobEvent,
        result_event: JobEvent | None = None,
        artifacts: dict[int, bytes] | None = None,
        now_ms: int,
        run_events: Sequence[JobEvent] = (),
        worker: str = "",
        read_back: bool = False,
    ) -> Finished:
        """Move a job to a final state if it is in `expected` (and, if given, under `assignment_id`),
        logging first `run_events`, the events of its run not logged yet, and setting `worker`
        (the one that ran it: its RUNNING event may be among those) unless "". With `read_back`
        the answer holds the job as it is then (what `load` reads), read in the same script.
        `encoded_result` is `result` already encoded (else it is converted here).
        """
        extra = self.artifacts.fields(job_id, artifacts or {})
        if encoded_result is None:
            encoded_result = _bytes(c.result_to_proto(result)) if result else b""
        events = [*run_events, *([result_event] if result_event else []), state_event]
        answer = await self._finishes.call(
            job_id,
            assignment_id,
            ",".join(s.name for s in expected),
            state.name,
            now_ms,
            self.ttl_s,
            _bytes(c.error_to_proto(error)) if error else b"",
            encoded_result,
            worker,
            *event_log.pack(events).args,
            "1" if read_back else "",
            *extra,
        )
        kind = answer[0].decode()
        if kind == "missing":
            raise job_not_found(job_id)
        before = JobState[answer[1].decode()]
        if kind == "no":
            return Finished(False, before)
        job = None
        if len(answer) > 5:
            fields = dict(zip(answer[5][::2], answer[5][1::2], strict=True))
            if result is not None and fields.get(b"result") == encoded_result:
                del fields[b"result"]  # the result it was given, not read back from its bytes
                job = self._decode(fields)
                job.job.result = result
                job.fields[b"result"] = encoded_result
            else:
                job = self._decode(fields)
        return Finished(True, before, answer[2].decode(), answer[3].decode(), job)

    async def requeue(
        self,
        job_id: str,
        message: str,
        *,
        assignment_id: str = "",
        lease_before_ms: int = 0,
        max_attempts: int,
        now_ms: int,
    ) -> tuple[str, JobError]:
        """Queue a running job again, `message` saying why (its QUEUED event's UNAVAILABLE error),
        or fail it when attempts are spent: 'queued', 'failed' or 'no', and the error a failed
        job gets."""
        failed_error = JobError("UNAVAILABLE", f"{message}; gave up after {max_attempts} attempts")
        queued = JobEvent(
            job_id=job_id, kind=EventKind.STATE, state=JobState.QUEUED, error=JobError("UNAVAILABLE", message)
        )
        failed = JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.FAILED, error=failed_error)
        answer = await self._run(
            "REQUEUE",
            job_id,
            assignment_id,
            lease_before_ms,
            max_attempts,
            now_ms,
            self.ttl_s,
            _bytes(c.event_to_proto(queued)),
            _bytes(c.error_to_proto(failed_error)),
            _bytes(c.event_to_proto(failed)),
        )
        return str(answer[0].decode()), failed_error

    async def renew(self, owner: str, job_ids: Sequence[str], expiry_ms: int) -> int:
        if not job_ids:
            return 0
        return int(await self._run("RENEW", owner, expiry_ms, *job_ids))

    async def expired_leases(self, now_ms: int, count: int = 200) -> list[str]:
        ids = await self.redis.zrangebyscore(self.prefix + "running", "-inf", now_ms, start=0, num=count)
        return [i.decode() for i in ids]

    async def due_deadlines(self, now_ms: int, count: int = 200) -> list[str]:
        ids = await self.redis.zrangebyscore(self.prefix + "deadlines", "-inf", now_ms, start=0, num=count)
        return [i.decode() for i in ids]

    async def drop_deadline(self, job_id: str) -> None:  # of a job that ended or is gone
        await self.redis.zrem(self.prefix + "deadlines", job_id)

    async def publish(self, message: str) -> None:
        await self.redis.publish(self.channel, message)

    # ---- gauges and the cluster's workers ----------------------------------------------

    async def note_pinned(self, queue: str) -> None:
        """Remember a queue of pinned jobs (`model@backend`: one per model and backend)."""
        await self.redis.sadd(self.prefix + "pinned", queue)

    async def active(self, tenant: str) -> int:
        """The tenant's jobs queued or running (what max_queued counts), on every controller."""
        return int(await self.redis.scard(self.prefix + "active:" + tenant))

    # ---- tidying (the upkeep's) ---------------------------------------------------------

    async def tenants(self) -> list[str]:
        """The tenants that submitted jobs; "" (no tenant, auth off) always, which SUBMIT does not
        add to the set (one command less per job)."""
        named = {t.decode() for t in await self.redis.smembers(self.prefix + "tenants")}
        return sorted(named | {""})

    async def sweep_listing(
        self, tenant: str | None, max_score_ms: int, offset: int, count: int
    ) -> tuple[int, int]:
        """Drop expired or evicted jobs from a listing (see SWEEP_LISTING): (next offset, removed)."""
        answer = await self._plain_scripts["SWEEP_LISTING"](
            keys=[], args=[self.prefix, self.listing_key(tenant), max_score_ms, offset, count]
        )
        return int(answer[0]), int(answer[1])

    async def sweep_active(self, tenant: str, cursor: int, count: int) -> tuple[int, int]:
        """Drop jobs no longer active from the tenant's set (see SWEEP_ACTIVE): (cursor, removed)."""
        answer = await self._plain_scripts["SWEEP_ACTIVE"](keys=[], args=[self.prefix, tenant, cursor, count])
        return int(answer[0]), int(answer[1])

    async def prune_fair(self, now_s: float) -> int:
        """Drop the fair-share finish tags at or before `now_s`; how many."""
        return int(await self._plain_scripts["PRUNE_FAIR"](keys=[], args=[self.prefix, repr(now_s)]))

    async def claim_worker(self, info: WorkerInfo, owner: str, lease_ms: int) -> tuple[str, int] | None:
        """Take worker id `info.id` for its process (`info.instance_id`) on controller `owner`;
        None when taken, else the (host, pid) of the other live process that holds it."""
        answer = await self._plain_scripts["CLAIM_WORKER"](
            keys=[], args=[self.prefix, info.id, info.instance_id, owner, info.hostname, info.pid, lease_ms]
        )
        if answer[0] == b"ok":
            return None
        return (answer[1] or b"").decode(), int(answer[2] or 0)

    async def put_workers(
        self, workers: Sequence[WorkerInfo], owner: str, lease_ms: int, expiry_ms: int
    ) -> list[str]:
        """Renew the claims of `owner`'s workers and list them for the cluster (until
        `expiry_ms`); returns the ids another process or controller holds now (not renewed)."""
        if not workers:
            return []
        args: list[Any] = [self.prefix, owner, lease_ms, expiry_ms]
        for w in workers:
            args += [w.id, w.instance_id, w.hostname, w.pid, _bytes(catalog_convert.worker_to_proto(w))]
        lost = await self._plain_scripts["WORKERS_SEEN"](keys=[], args=args)
        return [worker_id.decode() for worker_id in lost]

    async def drop_worker(self, info: WorkerInfo, owner: str) -> None:
        """Forget a worker `owner` held (claim and listing), unless another one holds its id now."""
        await self._plain_scripts["DROP_WORKER"](
            keys=[], args=[self.prefix, owner, info.id, info.instance_id]
        )

    async def workers(self, now_ms: int) -> list[WorkerInfo]:
        """Workers connected to any controller (their controller refreshed them lately)."""
        stale = await self.redis.zrangebyscore(self.prefix + "workers:seen", "-inf", now_ms)
        if stale:
            await self.redis.hdel(self.prefix + "workers", *stale)
            await self.redis.zrem(self.prefix + "workers:seen", *stale)
        rows = await self.redis.hgetall(self.prefix + "workers")
        return [
            catalog_convert.worker_from_proto(cluster_pb2.WorkerInfo.FromString(v)) for v in rows.values()
        ]
