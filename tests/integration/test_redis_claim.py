"""The Redis store's CLAIM script and the batch windows, against a real `redis-server`."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.router import WorkerHandle, WorkerRegistry
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.controller.engines.redis.upkeep import RedisUpkeep
from omnirt.controller.observability.metrics import Gauges
from omnirt.types import EventKind, GenerateRequest, Job, JobEvent, JobState, WorkerInfo
from tests.daemons import RedisServer

MODEL = "tiny-sd"
LONG_MS = 600_000  # a window far longer than the test: a job that waits for it stays queued


def now_ms() -> int:
    return int(time.time() * 1000)


async def submit(store: RedisJobStore, job_id: str) -> None:
    job = Job(id=job_id, state=JobState.QUEUED, model=MODEL, created_at=datetime.now(UTC))
    queued = JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.QUEUED)
    request = GenerateRequest(model=MODEL, prompt=job_id)
    assert await store.submit(job, request, b"", "k", 0.0, 100, queued) is None


async def claim(
    store: RedisJobStore, busy_window_ms: int, running: bool = False
) -> tuple[str, object] | None:
    """A claim; `running`: the controller knows jobs of the model run (its workers', the gauge's)."""
    assignment = f"asg-{time.monotonic_ns()}"
    return await store.claim(
        {MODEL: 4}, "ctl", assignment, 5000, 0, now_ms(), busy_window_ms, running={MODEL} if running else ()
    )


async def finish(store: RedisJobStore, job_id: str) -> None:
    event = JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.SUCCEEDED)
    stored = await store.load(job_id)
    changed, *_ = await store.finish(
        job_id,
        JobState.SUCCEEDED,
        expected=(JobState.RUNNING,),
        assignment_id=stored.assignment,
        state_event=event,
        now_ms=now_ms(),
    )
    assert changed


def ids(answer: tuple[str, object] | None) -> list[str]:
    assert answer is not None and isinstance(answer[1], list), f"expected claimed jobs, got {answer}"
    return [c.job_id for c in answer[1]]


def test_busy_window_waits_for_companions_only_while_the_model_runs(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        store = RedisJobStore(
            redis_server.url,
            job_ttl_s=60,
            idempotency_ttl_s=60,
            artifact_limit_bytes=1 << 20,
            artifact_dir=str(tmp_path),
            prefix="claim-test:",
        )
        try:
            await submit(store, "j-a")
            assert ids(await claim(store, LONG_MS)) == ["j-a"], "an idle model's job goes at once"
            await submit(store, "j-b")
            await submit(store, "j-c")
            waiting = await claim(store, LONG_MS, running=True)
            assert waiting is not None and waiting[0] == MODEL and isinstance(waiting[1], int)
            assert waiting[1] > now_ms() + LONG_MS // 2, "it waits out the busy window"
            assert (await store.load("j-b")).job.state is JobState.QUEUED
            # Without a busy window (the default) the same queue is claimed at once.
            assert sorted(ids(await claim(store, 0, running=True))) == ["j-b", "j-c"]

            await submit(store, "j-d")
            await submit(store, "j-e")
            busy = await claim(store, LONG_MS, running=True)
            assert isinstance((busy or ("", []))[1], int), "busy: they wait"
            for job_id in ("j-a", "j-b", "j-c"):
                await finish(store, job_id)
            assert sorted(ids(await claim(store, LONG_MS))) == ["j-d", "j-e"], "idle again: both at once"

            for i in range(4):
                await submit(store, f"j-full-{i}")
            full = await claim(store, LONG_MS, running=True)
            assert len(ids(full)) == 4, "a full batch never waits, busy or not"
        finally:
            await store.close()

    asyncio.run(scenario())


def test_the_model_runs_where_this_controller_or_the_clusters_gauge_says_so() -> None:
    """Redis counts no running jobs per model any more: the dispatcher tells CLAIM which models
    run, from its own workers (now) and the cluster's gauge (read each second)."""
    registry = WorkerRegistry()
    worker = WorkerHandle(WorkerInfo(id="w1", models=[MODEL, "other"], slots=2), link=SimpleNamespace())
    registry.add(worker)
    worker.start("job-1", "asg-1", MODEL)
    upkeep = SimpleNamespace(
        config=ControllerConfig(batch_window_ms=0, batch_busy_window_ms=100),
        engine=SimpleNamespace(depth=Gauges(running_by_model={"far": 2})),
        workers=registry,
    )
    queues = {MODEL: 4, f"{MODEL}@cuda": 4, "far": 4, "idle": 4}
    running = RedisUpkeep._running(cast(RedisUpkeep, upkeep), queues)
    assert running == {MODEL, f"{MODEL}@cuda", "far"}
    assert registry.running_by_model() == {MODEL: 1}
    upkeep.config = ControllerConfig(batch_window_ms=100, batch_busy_window_ms=100)
    assert RedisUpkeep._running(cast(RedisUpkeep, upkeep), queues) == set(), "no busy window: no need to know"
