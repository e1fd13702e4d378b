"""The engine with an in-process worker link: queueing, placement, results, loss, cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from omnirt._internal.protocol.messages import Assignment, CancelAssignment, ControllerMessage
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.jobs import JobRecord
from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.errors import InvalidRequest, QueueFull
from omnirt.types import GenerateRequest, GenerateResult, JobError, JobState, WorkerInfo

T = TypeVar("T")


class InProcessLink:
    """WorkerLink that records what the controller sends."""

    def __init__(self) -> None:
        self.sent: list[ControllerMessage] = []
        self.closed = False

    def send(self, message: ControllerMessage) -> None:
        self.sent.append(message)

    def close(self) -> None:
        self.closed = True

    def assignments(self) -> list[Assignment]:
        return [m for m in self.sent if isinstance(m, Assignment)]


def now(call: Coroutine[Any, Any, T]) -> T:
    """Run a memory-engine call to its end without an event loop: the engine waits on nothing
    (no I/O), so its calls finish without suspending (a test fails here if one ever does)."""
    try:
        call.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    call.close()
    raise AssertionError("a memory-engine call suspended")


def submit(engine: MemoryEngine, req: GenerateRequest, **kw: Any) -> tuple[JobRecord, bool]:
    """`EngineClient.submit`, and the new job's record (what these tests look into)."""
    job, deduplicated = now(engine.submit(req, **kw))
    return engine.store.get(job.id), deduplicated


def make_engine(**kw: object) -> MemoryEngine:
    """An engine that dispatches whatever it can at once (no busy batch window) unless told."""
    config: dict[str, object] = {"batch_busy_window_ms": 0, **kw}
    return MemoryEngine(ControllerConfig(**config), Catalog.load())  # type: ignore[arg-type]


def connect(
    engine: MemoryEngine, worker_id: str, slots: int = 1, loaded: tuple[str, ...] = ()
) -> InProcessLink:
    link = InProcessLink()
    info = WorkerInfo(id=worker_id, execution_mode="legacy_call", slots=slots, loaded_models=list(loaded))
    now(engine.worker_connected(info, link))
    return link


def request(**kw: object) -> GenerateRequest:
    fields: dict[str, object] = {"model": "tiny-sd", "prompt": "p", **kw}
    return GenerateRequest(**fields)  # type: ignore[arg-type]


def test_priority_then_fifo() -> None:
    engine = make_engine(max_batch_size=1)
    low1, _ = submit(engine, request(priority=0))
    high, _ = submit(engine, request(priority=50))
    low2, _ = submit(engine, request(priority=0))
    link = connect(engine, "w1", slots=3)
    assert engine.upkeep.dispatch() == 3
    assert [a.items[0].job_id for a in link.assignments()] == [high.job.id, low1.job.id, low2.job.id]


def test_never_more_jobs_than_slots_and_result_frees_a_slot() -> None:
    engine = make_engine(max_batch_size=1)
    jobs = [submit(engine, request())[0] for _ in range(3)]
    link = connect(engine, "w1", slots=2)
    engine.upkeep.dispatch()
    assert len(link.assignments()) == 2
    assert now(engine.get(jobs[2].job.id)).state is JobState.QUEUED
    first = link.assignments()[0]
    now(
        engine.worker_result(
            engine.workers.get("w1"), first.assignment_id, first.items[0].job_id, GenerateResult(""), None
        )
    )
    assert jobs[0].job.state is JobState.SUCCEEDED
    engine.upkeep.dispatch()
    assert len(link.assignments()) == 3


def test_prefers_the_warm_worker() -> None:
    engine = make_engine()
    cold = connect(engine, "a-cold", slots=1)
    warm = connect(engine, "b-warm", slots=1, loaded=("tiny-sd",))
    submit(engine, request())
    engine.upkeep.dispatch()
    assert len(warm.assignments()) == 1 and not cold.assignments()


def test_queue_bound_keeps_what_is_queued() -> None:
    engine = make_engine(max_queue=2)
    a, _ = submit(engine, request())
    submit(engine, request())
    with pytest.raises(QueueFull) as info:
        submit(engine, request())
    assert info.value.retry_after_s
    assert len(engine.queue) == 2 and now(engine.get(a.job.id)).state is JobState.QUEUED


def test_waiting_reason_names_the_missing_model() -> None:
    engine = make_engine()
    record, _ = submit(engine, request())
    assert "no connected worker serves model tiny-sd" in now(engine.get(record.job.id)).waiting_reason


def test_lost_worker_requeues_then_gives_up() -> None:
    engine = make_engine(max_attempts=2)
    record, _ = submit(engine, request())
    for attempt in (1, 2):
        link = connect(engine, f"w{attempt}")
        engine.upkeep.dispatch()
        assert record.job.state is JobState.RUNNING and record.job.attempts == attempt
        now(engine.worker_lost(engine.workers.get(f"w{attempt}"), "test"))
        del link
    assert record.job.state is JobState.FAILED
    assert record.job.error is not None and record.job.error.code == "UNAVAILABLE"


def test_late_result_from_a_lost_worker_is_ignored() -> None:
    engine = make_engine()
    record, _ = submit(engine, request())
    old = connect(engine, "old")
    engine.upkeep.dispatch()
    stale = old.assignments()[0]
    handle = engine.workers.get("old")
    now(engine.worker_lost(handle, "test"))
    new = connect(engine, "new")
    engine.upkeep.dispatch()
    now(engine.worker_result(handle, stale.assignment_id, record.job.id, GenerateResult(""), None))
    assert record.job.state is JobState.RUNNING  # still waiting for the new worker
    current = new.assignments()[0]
    now(
        engine.worker_result(
            engine.workers.get("new"), current.assignment_id, record.job.id, GenerateResult(""), None
        )
    )
    assert record.job.state is JobState.SUCCEEDED
    assert sum(1 for e in record.events if e.result is not None) == 1


def test_cancel_queued_running_and_finished() -> None:
    engine = make_engine()
    queued, _ = submit(engine, request(priority=0))
    running, _ = submit(engine, request(priority=10))
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    job, changed = now(engine.cancel(running.job.id))
    assert changed and job.state is JobState.CANCELLED
    assert any(isinstance(m, CancelAssignment) and m.job_id == running.job.id for m in link.sent)
    job, changed = now(engine.cancel(queued.job.id))
    assert changed and job.state is JobState.CANCELLED and len(engine.queue) == 0
    job, changed = now(engine.cancel(queued.job.id))
    assert not changed and job.state is JobState.CANCELLED


def test_worker_error_fails_the_job_with_its_reason() -> None:
    engine = make_engine()
    record, _ = submit(engine, request())
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    a = link.assignments()[0]
    error = JobError("FAILED_PRECONDITION", "cannot load tiny-sd: boom")
    now(engine.worker_result(engine.workers.get("w1"), a.assignment_id, record.job.id, None, error))
    assert record.job.state is JobState.FAILED and record.job.error == error


def test_idempotency_key() -> None:
    engine = make_engine()
    first, dedup1 = submit(engine, request(idempotency_key="k1"))
    again, dedup2 = submit(engine, request(idempotency_key="k1"))
    assert (dedup1, dedup2) == (False, True) and again is first
    with pytest.raises(InvalidRequest) as info:
        submit(engine, request(idempotency_key="k1", prompt="something else"))
    assert info.value.field == "idempotency_key"


def test_watch_replays_and_ends_at_the_final_state() -> None:
    async def scenario() -> list[str]:
        engine = make_engine()
        record, _ = submit(engine, request())
        now(engine.cancel(record.job.id))
        return [e.state.value for e in [x async for x in engine.watch(record.job.id)] if e.state]

    assert asyncio.run(scenario()) == ["queued", "cancelled"]


def test_waiting_raises_priority_so_nothing_starves() -> None:
    engine = make_engine(max_batch_size=1, priority_aging_s=1.0)
    old, _ = submit(engine, request(priority=0))
    old.first_enqueued_at -= 10  # it has waited 10 s: worth 10 priority levels
    engine.queue.remove(old.job.id)
    engine.queue.push(old)
    new_high, _ = submit(engine, request(priority=5))
    link = connect(engine, "w1", slots=1)
    engine.upkeep.dispatch()
    assert link.assignments()[0].items[0].job_id == old.job.id
    assert now(engine.get(new_high.job.id)).state is JobState.QUEUED


def test_compatible_jobs_share_one_call_and_one_slot() -> None:
    engine = make_engine(max_batch_size=4)
    same = [submit(engine, request(prompt=f"p{i}", seed=i))[0] for i in range(5)]
    other_size, _ = submit(engine, request(width=128))
    link = connect(engine, "w1", slots=1)
    engine.upkeep.dispatch()
    (batch,) = link.assignments()
    assert [i.job_id for i in batch.items] == [r.job.id for r in same[:4]]
    assert [i.request.seed for i in batch.items] == [0, 1, 2, 3], "seeds stay per request"
    assert batch.batch_group_id
    handle = engine.workers.get("w1")
    assert handle.busy_slots == 1 and handle.free_slots == 0
    for item in batch.items:
        now(engine.worker_result(handle, batch.assignment_id, item.job_id, GenerateResult(""), None))
    engine.upkeep.dispatch()
    second = link.assignments()[1]
    assert [i.job_id for i in second.items] == [same[4].job.id], "a different size is another call"
    assert now(engine.get(other_size.job.id)).state is JobState.QUEUED


def test_batch_window_waits_for_companions() -> None:
    async def scenario() -> list[int]:
        engine = make_engine(max_batch_size=4, batch_window_ms=150)
        await engine.start()
        try:
            link = connect(engine, "w1", slots=1)
            submit(engine, request(prompt="a"))
            await asyncio.sleep(0.05)
            submit(engine, request(prompt="b"))
            await asyncio.sleep(0.4)
            return [len(a.items) for a in link.assignments()]
        finally:
            await engine.stop()

    assert asyncio.run(scenario()) == [2]


def test_busy_window_waits_for_companions_only_while_the_model_runs() -> None:
    # A window far longer than the test: a job that waits for it stays queued.
    engine = make_engine(max_batch_size=4, batch_busy_window_ms=600_000)
    link = connect(engine, "w1", slots=3)
    handle = engine.workers.get("w1")
    first, _ = submit(engine, request(prompt="a"))
    engine.upkeep.dispatch()
    assert [len(a.items) for a in link.assignments()] == [1], "an idle model's job goes at once"

    waiting = [submit(engine, request(prompt=p))[0] for p in ("b", "c")]
    engine.upkeep.dispatch()
    assert len(link.assignments()) == 1 and all(r.job.state is JobState.QUEUED for r in waiting)
    assert engine.workers.running_of("tiny-sd") == 1

    # Its first job done, the model is idle again: the two waiting go together, at once.
    a = link.assignments()[0]
    now(engine.worker_result(handle, a.assignment_id, first.job.id, GenerateResult(""), None))
    assert engine.workers.running_of("tiny-sd") == 0
    engine.upkeep.dispatch()
    assert [len(a.items) for a in link.assignments()] == [1, 2]

    # A full batch never waits, busy or not.
    full = [submit(engine, request(prompt=str(i)))[0] for i in range(4)]
    engine.upkeep.dispatch()
    assert [len(a.items) for a in link.assignments()] == [1, 2, 4]
    assert all(r.job.state is JobState.RUNNING for r in full)


def test_busy_window_counts_only_jobs_of_the_same_model() -> None:
    engine = make_engine(max_batch_size=4, batch_busy_window_ms=600_000)
    connect(engine, "w1", slots=3)
    handle = engine.workers.get("w1")
    other, _ = submit(engine, request(model="null"))
    engine.upkeep.dispatch()
    mine, _ = submit(engine, request(prompt="a"))
    engine.upkeep.dispatch()
    assert other.job.state is JobState.RUNNING and mine.job.state is JobState.RUNNING
    assert (handle.running_of("null"), handle.running_of("tiny-sd")) == (1, 1)
    now(engine.worker_lost(handle, "test"))
    assert (handle.running_of("null"), handle.running_of("tiny-sd")) == (0, 0)


def test_no_batching_for_a_model_that_does_not_batch_or_when_off() -> None:
    engine = make_engine(max_batch_size=1)
    for i in range(3):
        submit(engine, request(prompt=str(i)))
    link = connect(engine, "w1", slots=3)
    engine.upkeep.dispatch()
    assert [len(a.items) for a in link.assignments()] == [1, 1, 1]


def test_a_job_the_worker_gives_up_is_retried() -> None:
    engine = make_engine()
    record, _ = submit(engine, request())
    first = connect(engine, "w1")
    engine.upkeep.dispatch()
    a = first.assignments()[0]
    error = JobError("UNAVAILABLE", "the worker stopped the job to shut down (drain timeout)")
    now(engine.worker_result(engine.workers.get("w1"), a.assignment_id, record.job.id, None, error))
    assert record.job.state is JobState.QUEUED and len(engine.queue) == 1
