"""What a job costs Redis, against a real `redis-server`: concurrent submits and results share one
script call (each still gets its own answer, a refusal only its own), and a job without a
deadline never touches the deadlines index, whose stale entries the upkeep drops."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import redis

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.tenants import TenantPolicy
from omnirt.controller.engines.redis.engine import RedisEngine
from omnirt.controller.engines.redis.records import QuotaRefusal
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.controller.engines.redis.upkeep import RedisUpkeep
from omnirt.types import EventKind, GenerateRequest, JobEvent, JobState
from tests.daemons import RedisServer, wait_for
from tests.integration.test_redis_tenant_scripts import MODEL, claim, end, now_ms, run, submit


def script_calls(server: RedisServer) -> int:
    with redis.Redis(port=server.port) as r:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def test_concurrent_submits_go_in_one_call_and_each_gets_its_own_answer(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario(store: RedisJobStore) -> None:
        policy = TenantPolicy(max_queued=5)
        before = script_calls(redis_server)
        answers = await asyncio.gather(
            *(submit(store, "acme", policy=policy) for _ in range(12)), return_exceptions=True
        )
        calls = script_calls(redis_server) - before
        accepted = [a for a in answers if isinstance(a, str)]
        refused = [a for a in answers if isinstance(a, QuotaRefusal)]
        assert (len(accepted), len(refused)) == (5, 7), answers
        assert calls <= 2, f"{calls} script calls for 12 submits"
        assert {(await store.load(job_id)).job.state for job_id in accepted} == {JobState.QUEUED}
        assert await store.active("acme") == 5, "the refused ones left nothing behind"

    run(redis_server, tmp_path, scenario)


def test_concurrent_results_go_in_one_call(redis_server: RedisServer, tmp_path: Path) -> None:
    """... and the final states of one call are told in one message ("E ID1 ID2 ..."), which
    wakes each job's waiters."""

    async def scenario(store: RedisJobStore) -> None:
        ids = [await submit(store, "") for _ in range(8)]
        for _ in ids:
            await claim(store)
        pubsub = store.redis.pubsub()
        await pubsub.subscribe(store.channel)
        before = script_calls(redis_server)
        finished = await asyncio.gather(
            *(
                store.finish(
                    job_id,
                    JobState.SUCCEEDED,
                    expected=(JobState.RUNNING,),
                    state_event=JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.SUCCEEDED),
                    now_ms=now_ms(),
                )
                for job_id in ids
            )
        )
        assert [f.changed for f in finished] == [True] * 8
        calls = script_calls(redis_server) - before
        assert calls <= 2, "8 results in one call"
        assert {(await store.load(job_id)).job.state for job_id in ids} == {JobState.SUCCEEDED}
        told: list[str] = []
        for _ in range(calls + 2):  # the subscription's confirmation, the calls' messages, none
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is not None:
                told.append(message["data"].decode())
        await pubsub.aclose()
        assert 1 <= len(told) <= calls, told
        assert sorted(job_id for text in told for job_id in text.split(" ")[1:]) == sorted(ids)
        notified: list[str] = []
        upkeep = SimpleNamespace(waiters=SimpleNamespace(notify=notified.append))
        for text in told:
            RedisUpkeep._on_message(cast(RedisUpkeep, upkeep), text)  # a stand-in: only its waiters
        assert sorted(notified) == sorted(ids), "each job's waiters are woken"

    run(redis_server, tmp_path, scenario)


def test_only_jobs_with_a_deadline_enter_the_deadline_index_and_stale_entries_go(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    prefix = "{omnirt}:"
    r = redis.Redis(port=redis_server.port, db=1)  # a database of its own: the default prefix

    def deadline_of(job_id: str) -> float | None:
        return r.zscore(prefix + "deadlines", job_id)

    async def scenario() -> None:
        url = redis_server.url.rsplit("/", 1)[0] + "/1"
        config = ControllerConfig(store=url, artifact_dir=str(tmp_path))
        engine = RedisEngine(config, Catalog.load())
        await engine.start()
        try:
            plain, _ = await engine.submit(GenerateRequest(model="tiny-sd", prompt="no deadline"))
            later = now_ms() + 3_600_000
            timed, _ = await engine.submit(GenerateRequest(model="tiny-sd", prompt="x", deadline_ms=later))
            older, _ = await engine.submit(GenerateRequest(model="tiny-sd", prompt="y", deadline_ms=later))
            assert deadline_of(plain.id) is None and deadline_of(timed.id) == later
            # A job as a controller from before `deadline_ms` in the hash stored it.
            r.hdel(prefix + "job:" + older.id, "deadline_ms")
            for job in (plain, timed, older):
                await engine.cancel(job.id)
            assert deadline_of(timed.id) is None and deadline_of(older.id) is None
            # Entries whose job ended or is gone (evicted, expired) are dropped once due.
            r.zadd(prefix + "deadlines", {"job-gone": now_ms() - 1000, plain.id: now_ms() - 1000})
            await asyncio.to_thread(
                wait_for, lambda: r.zcard(prefix + "deadlines") == 0, 10, "the stale entries to go"
            )
        finally:
            await engine.stop()

    asyncio.run(scenario())
    r.close()


def test_a_submit_whose_caller_left_before_it_was_sent_makes_no_job(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario(store: RedisJobStore) -> None:
        before = script_calls(redis_server)
        leaving = asyncio.ensure_future(submit(store, "gone"))
        await asyncio.sleep(0)  # it waits for the next call, with the calls of this turn
        leaving.cancel()
        staying = await submit(store, "here")
        assert leaving.cancelled()
        assert await store.active("gone") == 0 and await store.active("here") == 1
        assert (await store.load(staying)).job.state is JobState.QUEUED
        assert script_calls(redis_server) - before == 1

    run(redis_server, tmp_path, scenario)


def command_calls(server: RedisServer, *names: str) -> dict[str, int]:
    with redis.Redis(port=server.port) as r:
        stats = r.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in names}


def test_the_gauges_are_one_call_that_counts_only_queues_holding_jobs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Every controller reads the cluster's gauges each second: one script call, whose answer
    names the queues that hold jobs (and the pinned ones), not a ZCARD per catalog model. The
    running jobs are what the controllers alive say their workers run, summed; a job's claim
    and end write no count."""
    models = [MODEL, "other", *(f"idle-{i}" for i in range(50))]

    async def scenario(store: RedisJobStore) -> None:
        urgent = await submit(store, "alice", priority=5)
        before = command_calls(redis_server, "sadd", "srem")
        other = await submit(store, "", model="other")
        assert await end(store, other, JobState.CANCELLED)
        after = command_calls(redis_server, "sadd", "srem")
        assert after == before, 'the tenant "" (auth off) keeps no set of its jobs: they are counted'
        other = await submit(store, "", model="other")
        queued = await submit(store, "bob")
        before = command_calls(redis_server, "hincrby")
        assert await claim(store) == [urgent]
        assert await end(store, other, JobState.CANCELLED)
        assert command_calls(redis_server, "hincrby")["hincrby"] - before["hincrby"] == 2, "qdepth only"
        other = await submit(store, "", model="other")
        await store.note_pinned("other@cuda")
        # Another controller runs two jobs of MODEL and one of "other"; it stopped, or it
        # writes again within its keep (50 ms here).
        await store.gauges.read(models, "ctl-b", {MODEL: 2, "other": 1}, now_ms(), 50)
        before = command_calls(redis_server, "evalsha", "zcard", "hgetall")
        gauges = await store.gauges.read(models, "ctl-a", {MODEL: 1}, now_ms(), 5000)
        after = command_calls(redis_server, "evalsha", "zcard", "hgetall")
        assert gauges.queued_by_queue == {MODEL: 1, "other": 1, "other@cuda": 0}
        assert gauges.queued_by_model == {MODEL: 1, "other": 1}
        assert gauges.queued_by_priority == {0: 2}
        assert gauges.running_by_model == {MODEL: 3, "other": 1}, "both controllers' counts"
        assert gauges.active_by_tenant == {"": 1, "alice": 1, "bob": 1}
        assert after["evalsha"] - before["evalsha"] == 1, "one round trip"

        for job_id in (other, queued):
            assert await end(store, job_id, JobState.CANCELLED)
        assert await end(store, urgent, JobState.SUCCEEDED, JobState.RUNNING)
        await asyncio.sleep(0.1)  # ctl-b's count expires: it wrote nothing since
        before = command_calls(redis_server, "zcard")
        gauges = await store.gauges.read(models, "ctl-a", {}, now_ms(), 5000)
        zcards = command_calls(redis_server, "zcard")["zcard"] - before["zcard"]
        assert zcards == 3, 'no model\'s queue: the pinned one, and `queue` and `running` for the tenant ""'
        assert gauges.queued_by_model == {"other": 0} and gauges.queued_by_priority == {}
        assert gauges.running_by_model == {} and gauges.active_by_tenant == {"alice": 0, "bob": 0}

    run(redis_server, tmp_path, scenario)
