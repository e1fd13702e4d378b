"""The batch rule is written twice: `omnirt.controller.core.batching` (the memory engine decides
with it) and the Redis CLAIM script (a copy in Lua: the decision must be atomic with the claim).
This table holds both to the same answers, against a real `redis-server`: which queued jobs go
together, which wait for companions and until when.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.batching import batch_key, batch_key_id, batch_limit, window_due
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import Plan, validate
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.types import EventKind, GenerateRequest, Job, JobEvent, JobState, MediaInput, MediaRole, Task
from tests.daemons import RedisServer

MODEL = "tiny-sd"
IMAGE = {"task": Task.IMAGE2IMAGE, "inputs": [MediaInput(role=MediaRole.IMAGE, data=b"png")]}
WIDE = {"width": 128}  # another batch key than the model's default size

# An answer: ("ok", indices of the jobs claimed together) or ("wait", ms after the first job was
# queued until it goes anyway).
Answer = tuple[str, Any]


@dataclass(frozen=True)
class Case:
    """Jobs queued in this order (each 1 ms after the one before), then one claim `now` ms after
    the first; `jobs` holds each job's request fields besides the model, prompt and seed."""

    name: str
    jobs: list[dict[str, Any]]
    expected: Answer
    now: int = 10
    window_ms: int = 0
    busy_window_ms: int = 0
    model_running: bool = False  # another job of the model runs (the controller says so)
    max_batch_size: int = 4  # the controller's
    model_limit: int = 0  # the model's own max_batch_size (0 = the controller's)


CASES = [
    Case("alike jobs go together", [{}, {}, {}], ("ok", [0, 1, 2])),
    Case("at most the limit, in queue order", [{}] * 6, ("ok", [0, 1, 2, 3])),
    Case("the model's own limit within the controller's", [{}] * 3, ("ok", [0, 1]), model_limit=2),
    Case("another batch key does not join", [{}, WIDE, {}, WIDE], ("ok", [0, 2])),
    Case("no batching: alone, never waits", [{}] * 3, ("ok", [0]), window_ms=1000, max_batch_size=1),
    Case("media inputs: alone, never wait", [IMAGE, IMAGE], ("ok", [0]), window_ms=1000),
    Case("waits for companions within the window", [{}, {}], ("wait", 100), window_ms=100),
    Case("a lone job waits too", [{}], ("wait", 100), window_ms=100),
    Case("goes when the window ends", [{}, {}], ("ok", [0, 1]), now=100, window_ms=100),
    Case("a full batch never waits", [{}] * 4, ("ok", [0, 1, 2, 3]), window_ms=1000),
    Case("another key does not fill the batch", [{}, {}, {}, WIDE], ("wait", 1000), window_ms=1000),
    Case(
        "the busy window while the model runs",
        [{}, {}],
        ("wait", 500),
        busy_window_ms=500,
        model_running=True,
    ),
    Case("no busy window while the model is idle", [{}, {}], ("ok", [0, 1]), busy_window_ms=500),
    Case(
        "the window when it is longer than the busy one",
        [{}, {}],
        ("wait", 300),
        window_ms=300,
        busy_window_ms=100,
        model_running=True,
    ),
    Case(
        "the busy window ends too",
        [{}, {}],
        ("ok", [0, 1]),
        now=600,
        busy_window_ms=500,
        model_running=True,
    ),
]


@dataclass
class Queued:
    """A case's jobs as validated and queued: their plans and the enqueue times Redis holds."""

    plans: list[Plan]
    enqueued_ms: list[int] = field(default_factory=list)


def plans(case: Case) -> list[Plan]:
    """The case's requests, validated as the controller validates them."""
    spec = Catalog.load().resolve(MODEL)
    if case.model_limit:
        spec = dataclasses.replace(
            spec, limits=dataclasses.replace(spec.limits, max_batch_size=case.model_limit)
        )
    catalog = Catalog([spec])
    return [
        validate(GenerateRequest(model=MODEL, prompt=f"job {i}", seed=i, **fields), catalog)
        for i, fields in enumerate(case.jobs)
    ]


def rule_answer(case: Case, config: ControllerConfig, queued: Queued) -> Answer:
    """What `core.batching` decides for the first job: its batch key, its limit, its window."""
    limit = batch_limit(config, queued.plans[0].spec)
    keys = [batch_key(plan, limit) for plan in queued.plans]
    if keys[0] is None:
        return "ok", [0]
    peers = [i for i in range(1, len(keys)) if keys[i] == keys[0]]
    first = queued.enqueued_ms[0]
    due = window_due(
        enqueued=first,
        now=first + case.now,
        window=config.batch_window_ms,
        busy_window=config.batch_busy_window_ms,
        model_running=case.model_running,
        peers=len(peers),
        limit=limit,
    )
    if due is not None:
        return "wait", due - first
    return "ok", [0, *peers[: limit - 1]]


async def claim_answer(store: RedisJobStore, case: Case, config: ControllerConfig, queued: Queued) -> Answer:
    """What CLAIM decides for the same jobs, queued in Redis with the batch keys' ids."""
    start = datetime.now(UTC)
    limit = batch_limit(config, queued.plans[0].spec)
    for i, plan in enumerate(queued.plans):
        key = batch_key_id(batch_key(plan, limit))
        await submit(store, f"job-{i}", start + timedelta(milliseconds=i), plan, key, rank=float(i))
        queued.enqueued_ms.append(int(await store.redis.hget(store.prefix + f"job:job-{i}", "enqueued_ms")))
    first = queued.enqueued_ms[0]
    answer = await store.claim(
        {MODEL: limit},
        "ctl",
        "asg-case",
        60_000,
        config.batch_window_ms,
        first + case.now,
        busy_window_ms=config.batch_busy_window_ms,
        running={MODEL} if case.model_running else (),  # the controller knows what runs
    )
    assert answer is not None, "a queued job is always claimed or waits"
    model, claimed = answer
    assert model == MODEL
    if isinstance(claimed, int):
        return "wait", claimed - first
    return "ok", sorted(int(c.job_id.removeprefix("job-")) for c in claimed)


async def submit(
    store: RedisJobStore, job_id: str, created: datetime, plan: Plan, key: str, rank: float = -1.0
) -> None:
    job = Job(id=job_id, state=JobState.QUEUED, model=MODEL, created_at=created)
    queued = JobEvent(job_id=job_id, kind=EventKind.STATE, state=JobState.QUEUED)
    assert await store.submit(job, plan.request, b"", key, rank, 100, queued) is None


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_claim_script_and_the_batch_rule_give_the_same_answer(
    case: Case, redis_server: RedisServer, tmp_path: Path
) -> None:
    config = ControllerConfig(
        max_batch_size=case.max_batch_size,
        batch_window_ms=case.window_ms,
        batch_busy_window_ms=case.busy_window_ms,
    )
    queued = Queued(plans(case))

    async def scenario() -> Answer:
        store = RedisJobStore(
            redis_server.url,
            job_ttl_s=60,
            idempotency_ttl_s=60,
            artifact_limit_bytes=1 << 20,
            artifact_dir=str(tmp_path),
            prefix=f"rule-{CASES.index(case)}:",
        )
        try:
            return await claim_answer(store, case, config, queued)
        finally:
            await store.close()

    in_redis = asyncio.run(scenario())
    assert in_redis == case.expected, "the Lua CLAIM script"
    assert rule_answer(case, config, queued) == case.expected, "omnirt.controller.core.batching"
