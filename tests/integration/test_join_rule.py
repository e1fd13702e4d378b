"""Which queued job may join a step batch running on a worker, beside its slots, is decided by
`omnirt.controller.core.batching` (`step_key`, `step_rows`, `may_join`, `holds_back`, applied in
queue order: the memory engine's dispatch) and by the Redis CLAIM_JOIN script (a copy in Lua: the
decision must be atomic with the claim). This table holds both to the same answers, against a
real `redis-server`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from omnirt.controller.core.batching import (
    batch_key,
    batch_key_id,
    holds_back,
    join_room,
    may_join,
    step_key,
    step_rows,
)
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import Plan, validate
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.types import Adapter, EventKind, GenerateRequest, Job, JobEvent, JobState
from tests.daemons import RedisServer

MODEL, OTHER, UNSERVED = "tiny-sd", "tiny-sdxl", "tiny-flux"
LIMIT = 16  # the worker's step rows
BATCH_LIMIT = 8  # the controller's max_batch_size (tiny-sd sets no limit of its own)
RUNNING = {"model": MODEL, "width": 64, "height": 64}  # the running batch: 2 rows of this


@dataclass(frozen=True)
class Case:
    """Jobs queued in this order; `jobs` holds each one's request fields (and `tenant`)."""

    name: str
    jobs: list[dict[str, Any]]
    expected: list[int] | None  # the indices of the jobs that join (in one call), or None
    running_rows: int = 2
    served: tuple[str, ...] = (MODEL, OTHER)


WIDE = {"width": 96}
CASES = [
    Case("the same key joins", [{}], [0]),
    Case("another size does not", [WIDE], None),
    Case("more rows than the batch has room for do not", [{"num_outputs": 8}], None),
    Case("they do while there is room", [{"num_outputs": 7}], [0]),
    Case("no batch of its key runs: nothing to join", [{}], None, running_rows=0),
    Case("another adapter set does not join", [{"adapters": [Adapter(name="x")]}], None),
    Case("past a job of its own tenant and priority that cannot join", [WIDE, {}], [1]),
    Case("not past one of higher priority", [{**WIDE, "priority": 50}, {}], None),
    Case("not past another tenant's", [{**WIDE, "tenant": "acme"}, {"tenant": "beta"}], None),
    Case("past its own tenant's", [{**WIDE, "tenant": "acme"}, {"tenant": "acme"}], [1]),
    Case("not past one of another model the worker serves", [{"model": OTHER, "priority": 9}, {}], None),
    Case("past one of a model the worker does not serve", [{"model": UNSERVED, "priority": 9}, {}], [1]),
    Case(
        "the first that fits, in queue order", [WIDE, {"seed": 1}, {"seed": 2, "num_inference_steps": 7}], [1]
    ),
    Case("priority first", [{"seed": 1}, {"seed": 2, "priority": 5}], [1, 0]),
    Case("its call's companions join with it, as one call", [{}, {}, {}], [0, 1, 2]),
    Case("as many as the batch has room for", [{}, {}, {}], [0, 1], running_rows=12),
    Case("a companion shares the whole call", [{}, {"num_inference_steps": 7}, {}], [0, 2]),
]


@dataclass
class Queued:
    plans: list[Plan]
    tenants: list[str]
    order: list[int] = field(default_factory=list)  # job indices by rank, as Redis holds them


def plan_of(fields: dict[str, Any], index: int) -> Plan:
    fields = {k: v for k, v in fields.items() if k != "tenant"}
    model = fields.pop("model", MODEL)
    request = GenerateRequest(model=model, prompt=f"job {index}", **{"seed": index, **fields})
    return validate(request, Catalog.load())


def rule_answer(case: Case, queued: Queued) -> list[int] | None:
    """The rule as the memory engine applies it: in queue order, the first job of the batch's key
    with room, unless a job left waiting ahead of it that the worker serves holds it back; then
    the queued jobs that share its call (its batch key), as many as the room and the limit allow."""
    key = step_key(validate(GenerateRequest(prompt="running", **RUNNING), Catalog.load()))
    ahead: list[int] = []
    for i in queued.order:
        plan = queued.plans[i]
        if step_key(plan) == key and may_join(case.running_rows, step_rows(plan), LIMIT):
            blocked = any(
                queued.plans[a].spec.id in case.served
                and holds_back(
                    queued.plans[a].request.priority,
                    queued.tenants[a],
                    plan.request.priority,
                    queued.tenants[i],
                )
                for a in ahead
            )
            if not blocked:
                limit = min(BATCH_LIMIT, join_room(LIMIT, case.running_rows, step_rows(plan)))
                mine = batch_key(plan, BATCH_LIMIT)
                peers = [
                    j for j in queued.order if j != i and batch_key(queued.plans[j], BATCH_LIMIT) == mine
                ]
                return [i, *peers[: limit - 1]]
        ahead.append(i)
    return None


async def claim_answer(store: RedisJobStore, case: Case, queued: Queued) -> list[int] | None:
    start = datetime.now(UTC)
    for i, plan in enumerate(queued.plans):
        job = Job(
            id=f"job-{i}",
            state=JobState.QUEUED,
            model=plan.spec.id,
            created_at=start + timedelta(milliseconds=i),
            priority=plan.request.priority,
            tenant=queued.tenants[i],
        )
        event = JobEvent(job_id=job.id, kind=EventKind.STATE, state=JobState.QUEUED)
        key = batch_key_id(step_key(plan))
        bkey = batch_key_id(batch_key(plan, BATCH_LIMIT))
        rank = i / 1000 - plan.request.priority  # as the queue ranks them without aging
        existing = await store.submit(
            job, plan.request, b"", bkey, rank, 100, event, step_key=key, step_rows=step_rows(plan)
        )
        assert existing is None
    ranked = await store.redis.zrange(store.prefix + "queue", 0, -1)
    queued.order = [int(j.decode().removeprefix("job-")) for j in ranked]
    running = validate(GenerateRequest(prompt="running", **RUNNING), Catalog.load())
    room = LIMIT - case.running_rows
    served = "|" + "|".join(case.served) + "|"
    joins = [(MODEL, batch_key_id(step_key(running)), room, served, BATCH_LIMIT)] if case.running_rows else []
    if not joins:
        return None
    answer = await store.claim_join(joins, "ctl", "asg-join", 60_000, int(start.timestamp() * 1000))
    if answer is None:
        return None
    model, key_id, claimed = answer
    assert (model, key_id) == joins[0][:2]
    return [int(c.job_id.removeprefix("job-")) for c in claimed]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_join_script_and_the_join_rule_give_the_same_answer(
    case: Case, redis_server: RedisServer, tmp_path: Path
) -> None:
    queued = Queued(
        [plan_of(fields, i) for i, fields in enumerate(case.jobs)],
        [str(fields.get("tenant", "")) for fields in case.jobs],
    )

    async def scenario() -> list[int] | None:
        store = RedisJobStore(
            redis_server.url,
            job_ttl_s=60,
            idempotency_ttl_s=60,
            artifact_limit_bytes=1 << 20,
            artifact_dir=str(tmp_path),
            prefix=f"join-{CASES.index(case)}:",
        )
        try:
            return await claim_answer(store, case, queued)
        finally:
            await store.close()

    in_redis = asyncio.run(scenario())
    assert in_redis == case.expected, "the Lua CLAIM_JOIN script"
    assert rule_answer(case, queued) == case.expected, "omnirt.controller.core.batching, in queue order"
