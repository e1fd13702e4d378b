"""The Redis store's tenant rules, script by script, against a real `redis-server`: the owner kept
with the job, idempotency keys per tenant, the active count of max_queued through every way a
job ends, the shared token bucket and the fair-share ranks, each checked against the Python
that the in-memory engine runs (`controller/core/tenants.py`, `controller/engines/memory/queue.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from omnirt.controller.core.jobs import JobRecord
from omnirt.controller.core.tenants import UNLIMITED, FairClock, TenantPolicy, TokenBucket, bucket_size
from omnirt.controller.core.validation import Plan
from omnirt.controller.engines.memory.queue import JobQueue
from omnirt.controller.engines.redis.records import QuotaRefusal
from omnirt.controller.engines.redis.store import RedisJobStore, job_not_found
from omnirt.errors import JobNotFound
from omnirt.types import EventKind, GenerateRequest, Job, JobError, JobEvent, JobState, ModelSpec
from tests.daemons import RedisServer

MODEL = "tiny-sd"
_ids = itertools.count()


def run(
    redis_server: RedisServer, tmp_path: Path, scenario: Callable[[RedisJobStore], Awaitable[None]]
) -> None:
    """Run `scenario` on a store of its own (a fresh key prefix on the shared server)."""

    async def main() -> None:
        store = RedisJobStore(
            redis_server.url,
            job_ttl_s=60,
            idempotency_ttl_s=60,
            artifact_limit_bytes=1 << 20,
            artifact_dir=str(tmp_path),
            prefix=f"tenant-test-{next(_ids)}-{time.monotonic_ns()}:",
        )
        try:
            await scenario(store)
        finally:
            await store.close()

    asyncio.run(main())


def now_ms() -> int:
    return int(time.time() * 1000)


async def submit(
    store: RedisJobStore,
    tenant: str,
    *,
    policy: TenantPolicy = UNLIMITED,
    priority: int = 0,
    idem: str = "",
    at_ms: int | None = None,
    cost_s: float = 1.0,
    aging_s: float = 30.0,
    deadline_ms: int = 0,
    model: str = MODEL,
) -> str:
    """Submit one job of `tenant`; returns its id, or the id of the job its key matched."""
    job_id = f"job-{next(_ids)}"
    created = datetime.fromtimestamp((at_ms or now_ms()) / 1000, UTC)
    job = Job(
        id=job_id,
        state=JobState.QUEUED,
        model=model,
        priority=priority,
        created_at=created,
        idempotency_key=idem,
        tenant=tenant,
        deadline_ms=deadline_ms,
    )
    queued = JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.QUEUED)
    existing = await store.submit(
        job,
        GenerateRequest(model=model, prompt=job_id),
        b"same",
        "",
        -priority,  # the tenant ""'s rank (time left out: these tests compare ranks)
        1000,
        queued,
        policy=policy,
        cost_s=cost_s,
        aging_s=aging_s,
    )
    return existing or job_id


async def claim(store: RedisJobStore) -> list[str]:
    answer = await store.claim({MODEL: 1}, "ctl", f"asg-{next(_ids)}", 5000, 0, now_ms())
    assert answer is not None and isinstance(answer[1], list), answer
    return [c.job_id for c in answer[1]]


async def end(store: RedisJobStore, job_id: str, state: JobState, *expected: JobState) -> bool:
    stored = await store.load(job_id)
    changed, *_ = await store.finish(
        job_id,
        state,
        expected=expected or (JobState.QUEUED, JobState.RUNNING),
        assignment_id=stored.assignment if JobState.RUNNING in expected else "",
        error=JobError("X", "ended by the test") if state is not JobState.SUCCEEDED else None,
        state_event=JobEvent(job_id=job_id, kind=EventKind.STATE, state=state),
        now_ms=now_ms(),
    )
    return changed


async def requeue(store: RedisJobStore, job_id: str, max_attempts: int) -> str:
    outcome, _ = await store.requeue(job_id, "worker lost", max_attempts=max_attempts, now_ms=now_ms())
    return outcome


def test_the_tenant_is_stored_with_the_job_and_scopes_reads_and_listings(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario(store: RedisJobStore) -> None:
        alice = [await submit(store, "alice") for _ in range(5)]
        bob = await submit(store, "bob")
        anonymous = await submit(store, "")
        stored = await store.load(alice[0])
        assert stored.job.tenant == "alice"
        # In the static proto as well: what another controller decodes first.
        assert (await store.load(alice[0], "alice")).job.tenant == "alice"
        assert (await store.load(anonymous)).job.tenant == ""

        with pytest.raises(JobNotFound) as foreign:
            await store.load(alice[0], "bob")
        with pytest.raises(JobNotFound) as unknown:
            await store.load("job-unknown", "bob")
        assert str(foreign.value) == str(job_not_found(alice[0])), "the very words an unknown id gets"
        assert str(unknown.value) == str(job_not_found("job-unknown"))
        with pytest.raises(JobNotFound):
            await store.load(anonymous, "alice")

        newest_first = alice[::-1]
        page, more = await store.list_ids([], "", 2, 0, "alice")
        assert (page, more) == (newest_first[:2], True)
        page, more = await store.list_ids([], "", 2, 4, "alice")
        assert (page, more) == (newest_first[4:], False)
        assert (await store.list_ids([], "", 10, 0, "bob")) == ([bob], False)
        everyone, _ = await store.list_ids([], "", 10, 0)
        assert set(everyone) == {*alice, bob, anonymous}
        anonymous_only, _ = await store.list_ids([], "", 10, 0, "")
        assert anonymous_only == [anonymous]

        # An expired job leaves the tenant's listing; paging stays right.
        assert await end(store, alice[2], JobState.CANCELLED)
        await store.redis.delete(store.prefix + "job:" + alice[2])  # what its TTL does
        page, more = await store.list_ids([], "", 10, 0, "alice")
        assert (page, more) == ([a for a in newest_first if a != alice[2]], False)
        assert await store.redis.zscore(store.prefix + "jobs:t:alice", alice[2]) is None

        # CLAIM hands each job's tenant to the controller that dispatches it (its logs, spans).
        owners = {}
        while answer := await store.claim({MODEL: 1}, "ctl", f"asg-{next(_ids)}", 5000, 0, now_ms()):
            assert isinstance(answer[1], list)
            owners.update({c.job_id: c.tenant for c in answer[1]})
        assert owners == {**{a: "alice" for a in alice if a != alice[2]}, bob: "bob", anonymous: ""}

    run(redis_server, tmp_path, scenario)


def test_idempotency_keys_are_per_tenant_and_the_tenant_empty_keeps_its_key_layout(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario(store: RedisJobStore) -> None:
        a1 = await submit(store, "alice", idem="k")
        assert await submit(store, "alice", idem="k") == a1, "the same tenant deduplicates"
        b1 = await submit(store, "bob", idem="k")
        assert b1 != a1, "another tenant's key makes another job"
        # The tenant "" keeps `idem:KEY` (a rolling upgrade keeps deduplicating), and a key of
        # its own that looks like a tenant's layout meets nobody else's job.
        plain = await submit(store, "", idem="k")
        assert await store.redis.get(store.prefix + "idem:k") == plain.encode()
        lookalike = await submit(store, "", idem="alice:k")
        assert lookalike not in {a1, b1, plain}
        assert await submit(store, "alice", idem="k") == a1

    run(redis_server, tmp_path, scenario)


def test_max_queued_counts_a_job_out_exactly_once_whichever_way_it_ends(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    policy = TenantPolicy(max_queued=3)

    async def scenario(store: RedisJobStore) -> None:
        async def active() -> int:
            return await store.active("alice")

        first = [await submit(store, "alice", policy=policy, idem=f"k{i}") for i in range(3)]
        assert await active() == 3
        with pytest.raises(QuotaRefusal) as refused:
            await submit(store, "alice", policy=policy)
        assert (refused.value.reason, refused.value.active) == ("max_queued", 3)
        assert await submit(store, "alice", policy=policy, idem="k1") == first[1], "a duplicate costs nothing"
        # Another tenant has its own count (a model no claim here takes: alice's stay first).
        assert await submit(store, "bob", policy=policy, model="other") != ""
        assert await active() == 3

        # Finished by its worker.
        assert await claim(store) == [first[0]]
        assert await active() == 3, "running still counts"
        assert await end(store, first[0], JobState.SUCCEEDED, JobState.RUNNING)
        assert await active() == 2
        assert not await end(store, first[0], JobState.SUCCEEDED, JobState.RUNNING), "a late result"
        assert await active() == 2, "a second ending changes nothing"
        # Cancelled while queued.
        assert await end(store, first[1], JobState.CANCELLED)
        assert await active() == 1
        # Its worker lost: requeued (still counted), then failed once its attempts are spent.
        assert await claim(store) == [first[2]]
        assert await requeue(store, first[2], max_attempts=2) == "queued"
        assert await active() == 1, "a requeue does not change the count"
        assert await claim(store) == [first[2]]
        assert await requeue(store, first[2], max_attempts=2) == "failed"
        assert await active() == 0
        # A deadline that passes while queued (the reaper's FAILED, the same script).
        late = await submit(store, "alice", policy=policy, deadline_ms=now_ms() - 1)
        assert await active() == 1
        assert await store.due_deadlines(now_ms()) == [late]
        assert await end(store, late, JobState.FAILED)
        assert await active() == 0
        assert await store.active("bob") == 1

        # A job evicted from Redis (maxmemory) or ended by an older controller that knows no
        # tenants never passes through `finish`: the upkeep's sweep counts it out.
        evicted = await submit(store, "alice", policy=policy)
        ended = await submit(store, "alice", policy=policy)
        await store.redis.delete(store.prefix + "job:" + evicted)
        assert await end(store, ended, JobState.CANCELLED)
        await store.redis.sadd(store.prefix + "active:alice", ended)  # as an older FINISH leaves it
        queued = await submit(store, "alice", policy=policy)
        assert await active() == 3
        cursor, removed = await store.sweep_active("alice", 0, 100)
        assert (cursor, removed) == (0, 2)
        assert await active() == 1
        # The evicted job's id is still queued: a claim drops it and takes the next one.
        assert await claim(store) == [queued]
        assert await store.redis.zscore(store.prefix + "queue", evicted) is None
        assert (await store.gauges.read([MODEL])).active_by_tenant == {"alice": 1, "bob": 1}, "the gauge"
        assert await end(store, queued, JobState.CANCELLED, JobState.RUNNING)
        assert await active() == 0

    run(redis_server, tmp_path, scenario)


def test_the_rate_bucket_is_the_python_token_bucket_and_spends_only_on_queued_jobs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    policy = TenantPolicy(rate_per_s=2.0, burst=3)
    start = now_ms()
    steps = [0, 0, 0, 0, 100, 499, 500, 500, 1000, 1700, 1700, 5000, 5000, 5000, 5000, 5000]

    async def tokens(store: RedisJobStore, tenant: str = "alice") -> bytes:
        return bytes(await store.redis.hget(store.prefix + "bucket:" + tenant, "tokens"))

    async def scenario(store: RedisJobStore) -> None:
        python = TokenBucket(bucket_size(policy), start / 1000)
        accepted = []
        for step in steps:
            at = start + step
            expected_wait = python.take(policy.rate_per_s, bucket_size(policy), at / 1000)
            try:
                job_id = await submit(store, "alice", policy=policy, at_ms=at)
            except QuotaRefusal as refusal:
                assert refusal.reason == "rate"
                assert refusal.wait_s == expected_wait, f"at +{step} ms"
            else:
                assert expected_wait == 0.0, f"at +{step} ms Redis took a token Python did not have"
                accepted.append(job_id)
            assert float(await tokens(store)) == python.tokens, f"at +{step} ms"
        assert len(accepted) == 9  # 3 (the burst) + one at 0.5 s, 1 s, 1.7 s + 3 (full again)

        # A duplicate takes no token.
        first = await submit(store, "alice", policy=policy, idem="same", at_ms=start + 9000)
        assert float(await tokens(store)) == 2.0
        assert await submit(store, "alice", policy=policy, idem="same", at_ms=start + 9000) == first
        assert float(await tokens(store)) == 2.0
        # Nor does a job refused by max_queued (10 of the tenant's jobs are queued).
        capped = TenantPolicy(rate_per_s=2.0, burst=3, max_queued=10)
        with pytest.raises(QuotaRefusal) as full:
            await submit(store, "alice", policy=capped, at_ms=start + 9000)
        assert full.value.reason == "max_queued"
        assert float(await tokens(store)) == 2.0

        # A controller whose clock is behind refills nothing (the bucket's time never goes back).
        slow = TenantPolicy(rate_per_s=1.0)
        await submit(store, "bob", policy=slow, at_ms=start + 10_000)
        with pytest.raises(QuotaRefusal) as behind:
            await submit(store, "bob", policy=slow, at_ms=start + 5_000)
        assert behind.value.wait_s == 1.0
        with pytest.raises(QuotaRefusal):
            await submit(store, "bob", policy=slow, at_ms=start + 10_500)
        await submit(store, "bob", policy=slow, at_ms=start + 11_000)

    run(redis_server, tmp_path, scenario)


def record_for(job_id: str, tenant: str, priority: int, start_s: float) -> JobRecord:
    job = Job(id=job_id, state=JobState.QUEUED, model=MODEL, priority=priority, tenant=tenant)
    spec = ModelSpec(id=MODEL)
    record = JobRecord(job=job, plan=Plan(spec, GenerateRequest(model=MODEL)))
    record.start_s = start_s
    return record


@pytest.mark.parametrize("aging_s", [30.0, 0.0])
def test_fair_share_ranks_are_the_in_memory_engines(
    redis_server: RedisServer, tmp_path: Path, aging_s: float
) -> None:
    """The same submissions (tenant, priority, time, cost, weight) give the same start tags in
    Lua and in `FairClock`, the same ranks as the formula, and the same dispatch order as the
    in-memory `JobQueue`."""
    start = now_ms()
    weights = {"alice": 1.0, "bob": 1.0, "carol": 3.0}
    # alice floods; bob and carol come later with a few each; alice also sends one urgent job.
    plan = [("alice", 0, 0, 0.25)] * 12 + [("bob", 0, 40, 0.25), ("carol", 0, 45, 0.25)]
    plan += [("alice", 5, 60, 0.25), ("bob", 0, 70, 0.5), ("carol", 0, 70, 0.5), ("carol", 0, 70, 0.5)]
    plan += [("bob", 0, 2400, 0.001), ("alice", 0, 2600, 0.001)]

    async def scenario(store: RedisJobStore) -> None:
        clock = FairClock()
        queue = JobQueue(1000, aging_s)
        for tenant, priority, after_ms, cost in plan:
            at = start + after_ms
            job_id = await submit(
                store,
                tenant,
                priority=priority,
                at_ms=at,
                cost_s=cost,
                aging_s=aging_s,
                policy=TenantPolicy(weight=weights[tenant]),
            )
            s = clock.start(tenant, priority, cost, weights[tenant], at / 1000)
            expected = s / (aging_s or 2**32) - priority
            assert await store.redis.zscore(store.prefix + "queue", job_id) == expected, job_id
            queue.push(record_for(job_id, tenant, priority, s))
        redis_order = [i.decode() for i in await store.redis.zrange(store.prefix + "queue", 0, -1)]
        assert redis_order == [r.job.id for r in queue.records()]
        tenants_in_order = [(await store.load(i)).job.tenant for i in redis_order]
        # The urgent job first; then bob's and carol's first jobs right after alice's first.
        assert tenants_in_order[0] == "alice" and (await store.load(redis_order[0])).job.priority == 5
        assert set(tenants_in_order[2:4]) == {"bob", "carol"}, tenants_in_order

        # The tags at or before now go; those ahead stay.
        fair = await store.redis.hgetall(store.prefix + "fair")
        assert set(fair) == {b"alice|0", b"alice|5", b"bob|0", b"carol|0"}
        removed = await store.prune_fair(start / 1000 + 2.0)
        assert removed == 2  # alice|5 (at 0.31 s) and carol|0 (0.46 s); alice|0 3 s, bob|0 2.4 s
        assert set(await store.redis.hgetall(store.prefix + "fair")) == {b"alice|0", b"bob|0"}

    run(redis_server, tmp_path, scenario)


def test_the_tenant_empty_keeps_the_rank_it_is_given(redis_server: RedisServer, tmp_path: Path) -> None:
    async def scenario(store: RedisJobStore) -> None:
        ids = [await submit(store, "", priority=p) for p in (0, 3, 0)]
        scores = [await store.redis.zscore(store.prefix + "queue", i) for i in ids]
        assert scores == [0.0, -3.0, 0.0], 'no fair share for the tenant ""'
        assert await store.redis.hlen(store.prefix + "fair") == 0

    run(redis_server, tmp_path, scenario)


def test_the_listing_sweep_drops_expired_jobs_that_no_listing_met(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario(store: RedisJobStore) -> None:
        old = [await submit(store, "alice", at_ms=now_ms() - 600_000) for _ in range(5)]
        young = await submit(store, "alice")
        for job_id in old[:3]:
            await store.redis.delete(store.prefix + "job:" + job_id)
        created_before = now_ms() - 60_000
        offset, removed = await store.sweep_listing("alice", created_before, 0, 2)
        assert (offset, removed) == (0, 2), "a page of gone entries: the offset stays"
        offset, removed = await store.sweep_listing("alice", created_before, offset, 2)
        assert (offset, removed) == (1, 1), "one live one passed"
        offset, removed = await store.sweep_listing("alice", created_before, offset, 2)
        assert (offset, removed) == (0, 0), "the end: start over"
        left = await store.redis.zrange(store.prefix + "jobs:t:alice", 0, -1)
        assert [i.decode() for i in left] == [*old[3:], young]
        offset, removed = await store.sweep_listing(None, created_before, 0, 100)
        assert removed == 3 and await store.redis.zcard(store.prefix + "jobs") == 3

    run(redis_server, tmp_path, scenario)
