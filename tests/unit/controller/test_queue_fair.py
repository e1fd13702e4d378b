"""The queue's order with tenants (fair-share start tags) and the tenant helpers: the token
bucket, the run-time estimate and the fair-share clock."""

from __future__ import annotations

import math

import pytest

from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.jobs import JobRecord
from omnirt.controller.core.tenants import (
    Buckets,
    FairClock,
    RunTimes,
    TenantPolicy,
    TokenBucket,
    bucket_size,
    rate_exceeded,
)
from omnirt.controller.core.validation import Plan
from omnirt.controller.engines.memory.queue import JobQueue
from omnirt.types import GenerateRequest, Job, JobState

SPEC = Catalog.load().resolve("null")


def record(
    job_id: str, *, tenant: str = "", priority: int = 0, start: float = 0.0, at: float = 0.0
) -> JobRecord:
    job = Job(id=job_id, state=JobState.QUEUED, model="null", priority=priority, tenant=tenant)
    plan = Plan(spec=SPEC, request=GenerateRequest(model="null", prompt="p", priority=priority))
    return JobRecord(job=job, plan=plan, start_s=start, enqueued_at=at, first_enqueued_at=at)


def order(queue: JobQueue) -> list[str]:
    taken: list[str] = []

    def place(r: JobRecord) -> bool:
        taken.append(r.job.id)
        return True

    queue.take(place, len(queue))
    return taken


@pytest.mark.parametrize("aging_s", [0.0, 30.0])
def test_named_tenants_are_ordered_by_start_tag_within_a_priority(aging_s: float) -> None:
    queue = JobQueue(100, aging_s)
    # Pushed in this order; the tags say b's job started between a's first and second.
    queue.push(record("a1", tenant="a", start=100.0, at=100.0))
    queue.push(record("a2", tenant="a", start=101.0, at=100.0))
    queue.push(record("a3", tenant="a", start=102.0, at=100.0))
    queue.push(record("b1", tenant="b", start=100.5, at=100.5))
    assert order(queue) == ["a1", "b1", "a2", "a3"]


def test_priority_still_comes_first_for_named_tenants_without_aging() -> None:
    queue = JobQueue(100, 0.0)
    queue.push(record("late-tag", tenant="a", start=500.0))
    queue.push(record("urgent", tenant="a", priority=5, start=900.0))
    queue.push(record("early-tag", tenant="b", start=100.0))
    assert order(queue) == ["urgent", "early-tag", "late-tag"]


def test_the_tenant_without_a_name_keeps_fifo_with_aging() -> None:
    queue = JobQueue(100, 10.0)
    # No tag: the enqueue time ages them, and the push order breaks ties, as before tenants.
    queue.push(record("first", at=10.0))
    queue.push(record("second", at=10.0))
    queue.push(record("older", at=5.0))
    queue.push(record("high", priority=1, at=20.0))  # 10 s later, one level higher: ties 'first'
    assert order(queue) == ["older", "first", "second", "high"]


def test_a_requeued_named_job_keeps_its_tag() -> None:
    queue = JobQueue(100, 0.0)
    early = record("early", tenant="a", start=1.0)
    queue.push(early)
    queue.push(record("later", tenant="b", start=2.0))
    assert order(queue)[0] == "early"
    queue.push(early)  # its worker was lost: back in the queue with its tag
    queue.push(record("newest", tenant="b", start=3.0))
    assert order(queue) == ["early", "newest"]


def test_token_bucket_starts_full_refills_at_the_rate_and_says_how_long() -> None:
    bucket = TokenBucket(size=2, now=0.0)
    assert bucket.take(rate=0.5, size=2, now=0.0) == 0.0
    assert bucket.take(rate=0.5, size=2, now=0.0) == 0.0
    assert bucket.take(rate=0.5, size=2, now=0.0) == pytest.approx(2.0)  # a token every 2 s
    assert bucket.take(rate=0.5, size=2, now=1.0) == pytest.approx(1.0)  # half a token there
    assert bucket.take(rate=0.5, size=2, now=2.0) == 0.0
    # Idle for an hour: never more than the bucket holds.
    assert [bucket.take(0.5, 2, 3600.0) for _ in range(3)][2] > 0


def test_buckets_are_per_tenant_and_only_with_a_rate() -> None:
    buckets = Buckets()
    limited = TenantPolicy(rate_per_s=1.0)
    assert bucket_size(limited) == 1 and bucket_size(TenantPolicy(rate_per_s=2.5)) == 3
    assert buckets.take("a", limited, 0.0) == 0.0
    assert buckets.take("a", limited, 0.0) == pytest.approx(1.0)
    assert buckets.take("b", limited, 0.0) == 0.0  # another tenant, its own bucket
    assert all(buckets.take("c", TenantPolicy(), 0.0) == 0.0 for _ in range(100))
    # A reloaded key file (a larger burst) applies at the next call.
    assert buckets.take("a", TenantPolicy(rate_per_s=1.0, burst=5), 10.0) == 0.0


def test_rate_refusal_says_when_to_retry() -> None:
    error = rate_exceeded("alice", TenantPolicy(rate_per_s=10), 0.04)
    assert error.retry_after_s == pytest.approx(0.04)
    assert "tenant 'alice'" in error.message and "10 jobs/s" in error.message


def test_run_times_learn_per_model_per_job_with_a_floor() -> None:
    times = RunTimes()
    assert times.estimate("m") == 1.0
    for _ in range(60):
        times.observe("m", 0.4, batch_size=4)  # a batch of 4 in 0.4 s: 0.1 s a job
    assert times.estimate("m") == pytest.approx(0.1, rel=1e-3)
    assert times.estimate("other") == 1.0
    times.observe("fast", 0.0)
    assert times.estimate("fast") == RunTimes.FLOOR_S
    times.observe("fast", math.nan)
    times.observe("fast", -1.0)
    assert times.estimate("fast") == RunTimes.FLOOR_S


def test_fair_clock_charges_by_weight_per_tenant_and_priority() -> None:
    clock = FairClock()
    assert [clock.start("a", 0, 1.0, 1.0, 10.0) for _ in range(3)] == [10.0, 11.0, 12.0]
    assert clock.start("b", 0, 1.0, 1.0, 10.5) == 10.5  # another tenant is not behind a's backlog
    assert clock.start("a", 5, 1.0, 1.0, 10.5) == 10.5  # nor a's own higher priority
    heavy = [clock.start("h", 0, 1.0, 4.0, 10.0) for _ in range(3)]
    assert heavy == [10.0, 10.25, 10.5]
    assert clock.start("a", 0, 1.0, 1.0, 100.0) == 100.0  # the backlog's time has passed


def test_fair_clock_drops_entries_that_hold_no_one_back() -> None:
    clock = FairClock()
    for i in range(1000):
        clock.start(f"t{i}", 0, 1.0, 1.0, float(i))  # each entry passes a second later
    assert len(clock) < 130
