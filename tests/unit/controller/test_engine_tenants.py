"""The in-memory engine with tenants: scoped reads, idempotency per tenant, quotas, fair share,
and the tenant in results and metrics (an in-process worker link, as in test_engine)."""

from __future__ import annotations

import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from omnirt.controller.core.tenants import TenantPolicy
from omnirt.controller.edges.servicers import generate_response
from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.errors import JobNotFound, QuotaExceeded
from omnirt.types import GenerateResult, JobError, JobState
from tests.unit.controller.test_engine import connect, make_engine, now, request, submit

UNKNOWN = "job-0000000000000000"


def samples(engine: MemoryEngine) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = engine.metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def finish_next(engine: MemoryEngine, link_sent_before: int, link) -> str:  # type: ignore[no-untyped-def]
    """Complete the newest assignment and dispatch again; returns its job id."""
    assignment = link.assignments()[link_sent_before]
    job_id = assignment.items[0].job_id
    now(
        engine.worker_result(
            engine.workers.get("w1"), assignment.assignment_id, job_id, GenerateResult(""), None
        )
    )
    engine.upkeep.dispatch()
    return job_id


def not_found_text(read, job_id: str) -> str:  # type: ignore[no-untyped-def]
    """The message of the JobNotFound `read(job_id)` raises, the id itself left out."""
    with pytest.raises(JobNotFound) as info:
        read(job_id)
    return info.value.message.replace(job_id, "<id>")


def test_another_tenants_job_reads_as_unknown() -> None:
    engine = make_engine()
    mine, _ = submit(engine, request(), tenant="alice")
    job_id = mine.job.id
    for read in (
        lambda i: now(engine.get(i, tenant="bob")),
        lambda i: now(engine.cancel(i, tenant="bob")),
        lambda i: now(engine.artifact(i, 0, tenant="bob")),
        lambda i: engine.record(i, tenant="bob"),
    ):
        assert not_found_text(read, job_id) == not_found_text(read, UNKNOWN)
    assert now(engine.get(job_id)).state is JobState.QUEUED  # not cancelled by bob
    assert now(engine.get(job_id, tenant="alice")).tenant == "alice"
    submit(engine, request(), tenant="bob")
    assert [j.tenant for j in now(engine.list_jobs([], "", 10, 0, tenant="alice"))[0]] == ["alice"]
    assert sorted(j.tenant for j in now(engine.list_jobs([], "", 10, 0))[0]) == ["alice", "bob"]


def test_list_pages_count_only_the_tenants_jobs() -> None:
    engine = make_engine()
    for i in range(5):
        submit(engine, request(seed=i), tenant="alice")
        submit(engine, request(seed=i), tenant="bob")
    first, next_offset = now(engine.list_jobs([], "", 3, 0, tenant="alice"))
    rest, end = now(engine.list_jobs([], "", 3, next_offset, tenant="alice"))
    assert len(first) == 3 and len(rest) == 2 and end == 0
    assert {j.tenant for j in first + rest} == {"alice"}


def test_idempotency_keys_are_per_tenant() -> None:
    engine = make_engine()
    a, dedup_a = submit(engine, request(idempotency_key="k"), tenant="alice")
    b, dedup_b = submit(engine, request(idempotency_key="k"), tenant="bob")
    again, dedup_again = submit(engine, request(idempotency_key="k"), tenant="alice")
    assert a.job.id != b.job.id and not dedup_a and not dedup_b
    assert again.job.id == a.job.id and dedup_again


def test_max_queued_counts_queued_and_running_and_frees_on_finish_and_cancel() -> None:
    engine = make_engine(max_batch_size=1)
    policy = TenantPolicy(max_queued=2)
    first, _ = submit(engine, request(idempotency_key="one"), tenant="carol", policy=policy)
    second, _ = submit(engine, request(), tenant="carol", policy=policy)
    link = connect(engine, "w1")
    engine.upkeep.dispatch()  # one runs, one waits: both count
    with pytest.raises(QuotaExceeded) as info:
        submit(engine, request(), tenant="carol", policy=policy)
    assert info.value.retry_after_s == 1.0
    assert "tenant 'carol' has 2 jobs queued or running (max_queued 2)" in info.value.message
    # A resubmission under the same key is not a new job: not refused.
    assert submit(engine, request(idempotency_key="one"), tenant="carol", policy=policy)[1]
    submit(engine, request(), tenant="dave", policy=policy)  # another tenant: its own count
    assert len(now(engine.list_jobs([], "", 10, 0, tenant="carol"))[0]) == 2  # the refusal made nothing
    now(engine.cancel(second.job.id))
    submit(engine, request(), tenant="carol", policy=policy)
    finish_next(engine, 0, link)
    assert first.job.state is JobState.SUCCEEDED
    submit(engine, request(), tenant="carol", policy=policy)
    got = samples(engine)
    assert (
        got[("omnirt_quota_refusals_total", frozenset({("tenant", "carol"), ("reason", "max_queued")}))] == 1
    )
    assert got[("omnirt_tenant_active_jobs", frozenset({("tenant", "carol")}))] == 2
    assert got[("omnirt_tenant_active_jobs", frozenset({("tenant", "dave")}))] == 1


def test_active_count_survives_requeue_failure_and_expiry() -> None:
    engine = make_engine(max_batch_size=1, max_attempts=2)
    policy = TenantPolicy(max_queued=1)
    job, _ = submit(engine, request(), tenant="carol", policy=policy)
    connect(engine, "w1")
    engine.upkeep.dispatch()
    now(engine.worker_lost(engine.workers.get("w1"), "gone"))  # requeued: still active
    assert job.job.state is JobState.QUEUED
    with pytest.raises(QuotaExceeded):
        submit(engine, request(), tenant="carol", policy=policy)
    link = connect(engine, "w2")
    engine.upkeep.dispatch()
    (assignment,) = link.assignments()
    now(
        engine.worker_result(
            engine.workers.get("w2"), assignment.assignment_id, job.job.id, None, JobError("INTERNAL", "boom")
        )
    )
    assert job.job.state is JobState.FAILED
    deadline_ms = int(time.time() * 1000) + 30
    expiring, _ = submit(engine, request(deadline_ms=deadline_ms), tenant="carol", policy=policy)
    time.sleep(0.05)
    now(engine.upkeep.reap())
    assert expiring.job.state is JobState.FAILED
    submit(engine, request(), tenant="carol", policy=policy)  # room again: counted down once each
    assert samples(engine)[("omnirt_tenant_active_jobs", frozenset({("tenant", "carol")}))] == 1


def test_rate_limit_refuses_with_the_wait_and_spares_dedup_and_others() -> None:
    engine = make_engine()
    policy = TenantPolicy(rate_per_s=0.01, burst=2)  # no refill within the test
    submit(engine, request(idempotency_key="a"), tenant="dave", policy=policy)
    submit(engine, request(), tenant="dave", policy=policy)
    with pytest.raises(QuotaExceeded) as info:
        submit(engine, request(), tenant="dave", policy=policy)
    assert 99 < (info.value.retry_after_s or 0) <= 100
    assert submit(engine, request(idempotency_key="a"), tenant="dave", policy=policy)[1]
    submit(engine, request(), tenant="erin", policy=policy)
    got = samples(engine)
    assert got[("omnirt_quota_refusals_total", frozenset({("tenant", "dave"), ("reason", "rate")}))] == 1
    assert got[("omnirt_requests_total", frozenset({
        ("model", "tiny-sd"), ("task", "text2image"), ("code", "RESOURCE_EXHAUSTED"), ("tenant", "dave")
    }))] == 1  # fmt: skip


def test_a_refusal_by_max_queued_spends_no_token() -> None:
    engine = make_engine()
    policy = TenantPolicy(max_queued=1, rate_per_s=0.01, burst=2)
    first, _ = submit(engine, request(), tenant="dave", policy=policy)  # token 1 of 2
    with pytest.raises(QuotaExceeded, match="max_queued"):
        submit(engine, request(), tenant="dave", policy=policy)
    now(engine.cancel(first.job.id))
    second, _ = submit(engine, request(), tenant="dave", policy=policy)  # token 2 of 2
    now(engine.cancel(second.job.id))
    with pytest.raises(QuotaExceeded, match="rate limit"):
        submit(engine, request(), tenant="dave", policy=policy)


def test_a_flood_does_not_starve_another_tenants_job() -> None:
    engine = make_engine(max_batch_size=1)
    flood = [submit(engine, request(seed=i), tenant="a")[0].job.id for i in range(20)]
    single, _ = submit(engine, request(), tenant="b")
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    started = [finish_next(engine, i, link) for i in range(21)]
    assert started.index(single.job.id) <= 1  # after at most the flood's first job
    assert [j for j in started if j != single.job.id] == flood  # a's own jobs stay in order


def test_the_tenant_without_a_name_stays_fifo() -> None:
    engine = make_engine(max_batch_size=1)
    flood = [submit(engine, request(seed=i))[0].job.id for i in range(5)]
    last, _ = submit(engine, request())
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    assert [finish_next(engine, i, link) for i in range(6)] == [*flood, last.job.id]


def test_weights_share_dispatch() -> None:
    engine = make_engine(max_batch_size=1, priority_aging_s=0)
    heavy, light = TenantPolicy(weight=3), TenantPolicy(weight=1)
    for i in range(12):
        submit(engine, request(seed=i), tenant="heavy", policy=heavy)
        submit(engine, request(seed=i), tenant="light", policy=light)
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    tenant_of = {j.id: j.tenant for j in now(engine.list_jobs([], "", 100, 0))[0]}
    started = [tenant_of[finish_next(engine, i, link)] for i in range(12)]
    assert started.count("heavy") == 9  # 3:1 in the first 12 of 24


def test_results_carry_the_tenant_and_run_times_are_learnt() -> None:
    engine = make_engine(max_batch_size=1)
    job, _ = submit(engine, request(), tenant="alice")
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    finish_next(engine, 0, link)
    assert job.result is not None and job.result.report.tenant == "alice"
    answer = generate_response(job.job, engine.store.encoded(job.job))  # from the frozen job
    assert answer.job.tenant == "alice" and answer.result.report.tenant == "alice"
    assert engine.run_times.estimate("tiny-sd") < 1.0  # learnt from the run (well under 1 s here)
    got = samples(engine)
    assert got[("omnirt_jobs_total", frozenset({
        ("model", "tiny-sd"), ("task", "text2image"), ("state", "succeeded"), ("tenant", "alice")
    }))] == 1  # fmt: skip
