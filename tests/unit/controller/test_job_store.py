"""Finished jobs frozen to bytes: every read sees what it saw before, and the GC skips them."""

from __future__ import annotations

import asyncio
import gc
from datetime import UTC, datetime
from typing import Any

from omnirt._internal import convert as c
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt.controller.core.jobs import JobRecord
from omnirt.controller.core.router import WorkerHandle
from omnirt.controller.edges.servicers import generate_response
from omnirt.controller.edges.worker_stream import WireResult, WorkerGateway
from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.controller.engines.memory.store import FinishedJob
from omnirt.controller.observability.tracing import IdOnlyTracer, JobTracing, trace_id_of
from omnirt.types import (
    Artifact,
    EventKind,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    MediaKind,
    Progress,
    RunReport,
    StageTiming,
)
from omnirt.v1 import types_pb2
from tests.unit.controller.test_engine import connect, make_engine, now, request, submit

PNG = b"\x89PNG" + bytes(range(256)) * 8  # 2 KiB


def result(job_id: str, *sizes: int) -> GenerateResult:
    artifacts = [
        Artifact(index=i, kind=MediaKind.IMAGE, mime_type="image/png", data=PNG[:n], seed=7 + i, width=64)
        for i, n in enumerate(sizes)
    ]
    report = RunReport(
        job_id=job_id,
        worker_id="w1",
        model="tiny-sd",
        execution_ms=12.5,
        timings=[StageTiming("denoise", 10.0, 0.5)],
        config_resolved={"width": 64.0, "scheduler": "PNDMScheduler"},
        seeds=[7],
        warnings=["a warning"],
        started_at=datetime(2026, 11, 30, 1, 2, 3, 456789, tzinfo=UTC),
    )
    return GenerateResult(job_id=job_id, artifacts=artifacts, report=report)


def run_to_end(engine: MemoryEngine, record: JobRecord, outcome: GenerateResult | JobError) -> None:
    """Dispatch the job to worker w1, report progress and stages, then its outcome."""
    handle = engine.workers.get("w1")
    engine.upkeep.dispatch()
    assignment_id = record.assignment_id
    now(engine.worker_event(handle, assignment_id, _event(record, EventKind.STAGE, stage="denoise")))
    now(
        engine.worker_event(
            handle, assignment_id, _event(record, EventKind.PROGRESS, progress=Progress(2, 4))
        )
    )
    if isinstance(outcome, JobError):
        now(engine.worker_result(handle, assignment_id, record.job.id, None, outcome))
    else:
        now(engine.worker_result(handle, assignment_id, record.job.id, outcome, None))


def _event(record: JobRecord, kind: EventKind, **fields: object) -> JobEvent:
    return JobEvent(job_id=record.job.id, kind=kind, **fields)  # type: ignore[arg-type]


def test_a_frozen_job_reads_back_as_it_was_finished() -> None:
    engine = make_engine(inline_limit_bytes=1024)
    connect(engine, "w1", slots=4)
    ok, _ = submit(engine, request(prompt="a fox", width=64, labels={"team": "a"}, extra={"k": "v"}))
    run_to_end(engine, ok, result(ok.job.id, 100, 2000))  # the second artifact is over the limit
    failed, _ = submit(engine, request())
    run_to_end(engine, failed, JobError("FAILED_PRECONDITION", "cannot load", field="model"))

    for live in (ok, failed):
        entry = engine.store._jobs[live.job.id]
        assert isinstance(entry, FinishedJob)  # outside an event loop: frozen at once
        thawed = engine.store.get(live.job.id)
        assert thawed is not live
        assert thawed.job == live.job
        assert thawed.events == live.events
        assert thawed.fingerprint == live.fingerprint
    assert [e.kind for e in ok.events] == [
        EventKind.STATE,
        EventKind.STATE,
        EventKind.STAGE,
        EventKind.PROGRESS,
        EventKind.RESULT,
        EventKind.STATE,
    ]

    # The client's view left the big artifact's bytes out; DownloadArtifact still has them all.
    job = now(engine.get(ok.job.id))
    assert job.result is not None and job.result.artifacts[1].data == b""
    assert job.result.artifacts[1].uri == f"omnirt://jobs/{ok.job.id}/artifacts/1"
    data, full = now(engine.artifact(ok.job.id, 1))
    assert data == PNG[:2000] and full.artifacts[0].data == PNG[:100]
    request_back = engine.store.get(ok.job.id).plan.request
    assert (request_back.prompt, request_back.width, request_back.labels) == ("a fox", 64, {"team": "a"})
    assert now(engine.get(failed.job.id)).error == JobError(
        "FAILED_PRECONDITION", "cannot load", field="model"
    )


def test_lists_filters_pages_and_idempotency_work_on_frozen_jobs() -> None:
    engine = make_engine()
    connect(engine, "w1", slots=8)
    records = [submit(engine, request(idempotency_key=f"k{i}"))[0] for i in range(5)]
    for record in records[:3]:
        run_to_end(engine, record, result(record.job.id, 10))
    jobs, next_offset = now(engine.list_jobs([JobState.SUCCEEDED], "tiny-sd", limit=2, offset=0))
    assert [j.id for j in jobs] == [records[2].job.id, records[1].job.id] and next_offset == 2
    jobs, next_offset = now(engine.list_jobs([JobState.SUCCEEDED], "", limit=2, offset=2))
    assert [j.id for j in jobs] == [records[0].job.id] and next_offset == 0
    assert now(engine.list_jobs([], "other-model", 10, 0)) == ([], 0)
    again, deduplicated = submit(engine, request(idempotency_key="k0"))
    assert deduplicated and again.job.id == records[0].job.id and again.job.state is JobState.SUCCEEDED


def test_eviction_drops_frozen_jobs_and_their_idempotency_keys() -> None:
    engine = make_engine(max_finished_jobs=2)
    connect(engine, "w1", slots=8)
    records = [submit(engine, request(idempotency_key=f"k{i}"))[0] for i in range(3)]
    for record in records:
        run_to_end(engine, record, result(record.job.id, 10))
    assert len(engine.store) == 2
    fresh, deduplicated = submit(engine, request(idempotency_key="k0"))
    assert not deduplicated and fresh.job.id != records[0].job.id


def test_kept_finished_jobs_cost_the_garbage_collector_almost_nothing() -> None:
    engine = make_engine()
    link = connect(engine, "w1", slots=1)
    for _ in range(20):  # first calls fill caches (metrics series, conversion tables)
        record, _ = submit(engine, request())
        run_to_end(engine, record, result(record.job.id, 100))
    link.sent.clear()  # the test's link keeps what it was sent; a worker's stream does not
    gc.collect()
    before = len(gc.get_objects())
    count = 500
    for _ in range(count):
        record, _ = submit(engine, request(prompt="p", labels={"a": "b"}))
        run_to_end(engine, record, result(record.job.id, 100))
        link.sent.clear()
    del record
    gc.collect()
    # A live finished record is ~35 tracked objects (job, result, report, events, request...);
    # frozen, it is one tuple whose contents the collector does not track.
    per_job = (len(gc.get_objects()) - before) / count
    assert per_job <= 1.1, per_job
    assert len(engine.store) == count + 20


def test_a_job_is_frozen_only_after_its_waiters_were_woken() -> None:
    async def scenario() -> None:
        engine = make_engine()
        connect(engine, "w1", slots=1)
        record, _ = submit(engine, request())
        waiter = asyncio.ensure_future(engine.wait(record.job.id))
        await asyncio.sleep(0)
        run_to_end(engine, record, result(record.job.id, 10))
        assert isinstance(engine.store._jobs[record.job.id], JobRecord)  # not yet: waiters first
        woken = await waiter
        assert woken is record.job and woken.result is not None
        await asyncio.sleep(0)
        assert isinstance(engine.store._jobs[record.job.id], FinishedJob)
        assert now(engine.get(record.job.id)).result == record.job.result

    asyncio.run(scenario())


def answer(engine: MemoryEngine, job: Job) -> Any:
    """What the Generate servicer answers for a final job (from the store's bytes when it has them)."""
    return generate_response(job, engine.store.encoded(job))


def test_the_answer_of_a_finished_job_is_its_conversion_made_once() -> None:
    async def generate_like(engine: MemoryEngine, record: JobRecord) -> tuple[bool, Job, Any]:
        """What the Generate servicer does: wait for the job, then answer it."""
        job = await engine.wait(record.job.id)
        live_then = isinstance(engine.store._jobs[job.id], JobRecord)
        message = answer(engine, job)
        frozen_by_it = isinstance(engine.store._jobs[job.id], FinishedJob)
        return live_then and frozen_by_it, job, message

    async def scenario() -> None:
        engine = make_engine(inline_limit_bytes=1024)
        connect(engine, "w1", slots=1)
        record, _ = submit(engine, request(labels={"team": "a"}))
        waiter = asyncio.ensure_future(generate_like(engine, record))
        await asyncio.sleep(0)
        run_to_end(engine, record, result(record.job.id, 100, 2000))
        live_then, job, message = await waiter
        # The waiter answered before the job was frozen, and answering froze the job (the
        # freeze scheduled after the waiters then finds it done): one conversion for both.
        assert live_then and isinstance(engine.store._jobs[job.id], FinishedJob)
        assert message.job == c.job_to_proto(job, with_result=False), "the result travels once"
        assert job.result is not None and message.result == c.result_to_proto(job.result)
        assert message.result.artifacts[1].uri and not message.result.artifacts[1].data
        assert answer(engine, job) == message  # frozen already: read back alike
        engine.store._jobs.pop(job.id)
        assert engine.store.encoded(job) is None
        assert answer(engine, job) == message, "evicted meanwhile: converted as it is"

    asyncio.run(scenario())


def worker_sent(
    engine: MemoryEngine,
    handle: WorkerHandle,
    record: JobRecord,
    outcome: GenerateResult,
    sent: types_pb2.GenerateResult,
) -> None:
    """What the worker stream does with a result: the engine takes the dataclass while the
    store has the message at hand (`core.encoded.ArrivingResults`)."""
    with engine.store.arriving(record.job.id, record.assignment_id, WireResult(sent)):
        now(engine.worker_result(handle, record.assignment_id, record.job.id, outcome, None))


def test_a_result_kept_as_the_worker_sent_it_is_what_clients_read() -> None:
    engine = make_engine(inline_limit_bytes=1024)
    engine.tracing = JobTracing(IdOnlyTracer())  # jobs get trace ids
    connect(engine, "w1", slots=2)
    handle = engine.workers.get("w1")
    jobs = {}
    for name, sizes in (("small", (100,)), ("cut", (100, 2000))):
        record, _ = submit(engine, request(prompt=name))
        engine.upkeep.dispatch()
        outcome = result(record.job.id, *sizes)
        for artifact in outcome.artifacts:
            artifact.size_bytes = len(artifact.data)  # as a worker sends them
        sent = c.result_to_proto(outcome)
        sent.job_id = ""  # the worker's message, as the controller then completes it
        sent.report.warnings.append("only in the message")  # marks where the answer came from
        sent.report.trace_id = "f" * 32  # the worker's idea of the trace
        worker_sent(engine, handle, record, outcome, sent)
        jobs[name] = record

    small = answer(engine, jobs["small"].job)
    assert "only in the message" in small.result.report.warnings, "kept as sent"
    assert small.result.job_id == jobs["small"].job.id
    assert small.result.report.trace_id == trace_id_of(jobs["small"].job.id) != "f" * 32
    assert now(engine.get(jobs["small"].job.id)).result.artifacts[0].data == PNG[:100]  # type: ignore[union-attr]
    # An artifact cut from the client's view: the message is not what clients see (the view is
    # converted), but it is the full result DownloadArtifact reads, kept as sent.
    cut = answer(engine, jobs["cut"].job)
    assert "only in the message" not in cut.result.report.warnings
    assert cut.result.artifacts[1].uri and not cut.result.artifacts[1].data
    data, full = now(engine.artifact(jobs["cut"].job.id, 1))
    assert data == PNG[:2000] and "only in the message" in full.report.warnings
    assert full.job_id == jobs["cut"].job.id and full.report.trace_id == trace_id_of(jobs["cut"].job.id)
    # A worker that leaves sizes out: the view says them, so its message is not kept at all.
    record, _ = submit(engine, request(prompt="sizes"))
    engine.upkeep.dispatch()
    outcome = result(record.job.id, 100)
    sent = c.result_to_proto(outcome)
    sent.report.warnings.append("only in the message")
    worker_sent(engine, handle, record, outcome, sent)
    sized = answer(engine, record.job)
    assert "only in the message" not in sized.result.report.warnings
    assert sized.result.artifacts[0].size_bytes == 100


def test_the_worker_stream_hands_the_memory_store_the_result_as_it_came() -> None:
    engine = make_engine(inline_limit_bytes=1024)
    connect(engine, "w1", slots=2)
    handle = engine.workers.get("w1")

    async def sent_through(gateway: WorkerGateway) -> JobRecord:
        record, _ = submit(engine, request())
        engine.upkeep.dispatch()
        outcome = result(record.job.id, 100)
        outcome.artifacts[0].size_bytes = 100  # as a worker sends it
        message = pb.AssignmentResult(
            assignment_id=record.assignment_id, job_id=record.job.id, result=c.result_to_proto(outcome)
        )
        await gateway._handle(handle, pb.ConnectRequest(result=message), True)
        assert record.job.state is JobState.SUCCEEDED
        return record  # still live: it is frozen once the loop turns

    async def scenario() -> None:
        # Wired as `engines.make_engine` wires the memory engine: the store keeps the bytes.
        kept = await sent_through(WorkerGateway(engine, arriving_results=engine.store))
        assert kept.result_encoded is not None
        assert types_pb2.GenerateResult.FromString(kept.result_encoded).job_id == kept.job.id
        # Without a store to hand them to (the Redis engine's wiring), nothing is kept.
        converted = await sent_through(WorkerGateway(engine))
        assert converted.result_encoded is None

    asyncio.run(scenario())
