"""The reaper: jobs past their deadline fail, queued or running; the others are left alone."""

from __future__ import annotations

import time

from omnirt.types import GenerateResult, JobState
from tests.unit.controller.test_engine import connect, make_engine, now, request, submit


def _wait_past(ms: int) -> None:
    time.sleep(ms / 1000 + 0.01)


def test_only_jobs_past_their_deadline_fail_and_say_where() -> None:
    engine = make_engine(max_batch_size=1)
    link = connect(engine, "w1")
    running, _ = submit(engine, request(seed=1, timeout_ms=20))
    engine.upkeep.dispatch()
    queued, _ = submit(engine, request(seed=2, timeout_ms=20))
    later, _ = submit(engine, request(seed=3, timeout_ms=600_000))
    never, _ = submit(engine, request(seed=4))
    _wait_past(20)
    now(engine.upkeep.reap())
    for record, where in ((running, "while running"), (queued, "while queued")):
        assert record.job.state is JobState.FAILED and record.job.error is not None
        assert (record.job.error.code, record.job.error.message) == (
            "DEADLINE_EXCEEDED",
            f"deadline passed {where}",
        )
    assert later.job.state is JobState.QUEUED and never.job.state is JobState.QUEUED
    # The worker is told to stop the running one.
    assert [(m.job_id, m.reason) for m in link.sent if hasattr(m, "reason")] == [
        (running.job.id, "DEADLINE_EXCEEDED")
    ]


def test_jobs_that_finish_in_time_leave_nothing_behind_for_the_reaper() -> None:
    engine = make_engine(max_batch_size=1)
    connect(engine, "w1", slots=4)
    handle = engine.workers.get("w1")
    for seed in range(3000):
        record, _ = submit(engine, request(seed=seed, timeout_ms=600_000))
        engine.upkeep.dispatch()
        now(
            engine.worker_result(
                handle, record.assignment_id, record.job.id, GenerateResult(job_id=record.job.id), None
            )
        )
        assert record.job.state is JobState.SUCCEEDED
        now(engine.upkeep.reap())
    # What the reaper keeps stays proportional to the live jobs, not to every job ever seen.
    assert len(engine.deadlines) <= 1024 + 2
    late, _ = submit(engine, request(seed=1, timeout_ms=10))
    _wait_past(10)
    now(engine.upkeep.reap())
    assert late.job.state is JobState.FAILED
