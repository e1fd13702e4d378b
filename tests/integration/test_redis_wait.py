"""A client that goes away stops being served: a cancelled wait or watch on the Redis engine ends,
whenever the cancellation lands (a real `redis-server`)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.engines.redis.engine import RedisEngine
from omnirt.types import GenerateRequest
from tests.daemons import RedisServer


async def cancelled_at_a_wake_up(engine: RedisEngine, job_id: str, waiting: asyncio.Future[object]) -> bool:
    """Cancel `waiting` in the loop turn a progress event wakes it; True when it really ended."""
    await asyncio.sleep(0.1)  # parked on its wake-up event
    engine.waiters.notify(job_id)  # a progress event of the running job...
    waiting.cancel()  # ...and the client's call cancelled in the same turn
    done, _ = await asyncio.wait({waiting}, timeout=5)
    return bool(done) and waiting.cancelled()


def test_a_cancelled_wait_or_watch_ends_even_when_woken_in_the_same_turn(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    async def scenario() -> None:
        config = ControllerConfig(store=redis_server.url, artifact_dir=str(tmp_path))
        engine = RedisEngine(config, Catalog.load())
        job, _ = await engine.submit(GenerateRequest(model="tiny-sd", prompt="nobody waits"))
        for _ in range(5):  # asyncio.wait_for swallowed this cancellation every time (Python 3.11)
            waiting = asyncio.ensure_future(engine.wait(job.id))
            assert await cancelled_at_a_wake_up(engine, job.id, waiting), "Generate went on waiting"

            async def watch() -> None:
                async for _ in engine.watch(job.id):
                    pass

            watching = asyncio.ensure_future(watch())
            assert await cancelled_at_a_wake_up(engine, job.id, watching), "WatchJob went on watching"
        assert not engine.waiters, "every waiter unregistered"

    asyncio.run(scenario())


def test_a_cancelled_wait_or_watch_ends_wherever_the_cancellation_lands(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Also inside a Redis call: redis-py sends commands under asyncio.wait_for, which lost the
    cancellation in about a third of these tries before the engine checked for it."""

    async def scenario() -> None:
        config = ControllerConfig(store=redis_server.url, artifact_dir=str(tmp_path))
        engine = RedisEngine(config, Catalog.load())
        job, _ = await engine.submit(GenerateRequest(model="tiny-sd", prompt="nobody waits either"))
        running = True

        async def progress_events() -> None:  # a busy job: its watchers wake up all the time
            while running:
                engine.waiters.notify(job.id)
                await asyncio.sleep(rng.random() * 0.002)

        async def watch() -> None:
            async for _ in engine.watch(job.id):
                pass

        rng = random.Random(7)
        events = asyncio.ensure_future(progress_events())
        lost = []
        for i in range(120):
            waiting = asyncio.ensure_future(engine.wait(job.id) if i % 2 else watch())
            await asyncio.sleep(rng.random() * 0.01)
            waiting.cancel()
            done, _ = await asyncio.wait({waiting}, timeout=2)
            if not (done and waiting.cancelled()):
                lost.append(i)
                waiting.cancel()
        running = False
        await events
        assert lost == [], f"{len(lost)} of 120 cancelled waits went on"

    asyncio.run(scenario())
