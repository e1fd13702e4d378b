"""The engine's view of a worker heals: heartbeats reconcile its slots, its id stays its own,
and models the catalog lacks are named (in-process worker link, see test_engine)."""

from __future__ import annotations

import asyncio
import time

import pytest

from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt.controller.edges.worker_stream import StreamLink, WorkerGateway
from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.errors import AlreadyExists
from omnirt.types import JobError, JobState, WorkerInfo
from tests.unit.controller.test_engine import InProcessLink, make_engine, now, request, submit


def connect(engine: MemoryEngine, instance: str = "i1", models: tuple[str, ...] = ()) -> InProcessLink:
    link = InProcessLink()
    info = WorkerInfo(
        id="w1", execution_mode="legacy_call", slots=1, instance_id=instance, models=list(models)
    )
    now(engine.worker_connected(info, link))
    return link


def test_a_job_its_worker_does_not_list_is_released_and_requeued_after_a_grace() -> None:
    engine = make_engine()
    link = connect(engine)
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    handle = engine.workers.get("w1")
    # The first heartbeat after the assignment may have left before the worker saw it, and one
    # heartbeat that leaves it out is not enough.
    for _ in range(2):
        now(engine.worker_heartbeat(handle, [], False, set()))
        assert record.job.state is JobState.RUNNING and handle.busy_slots == 1
    now(engine.worker_heartbeat(handle, [], False, set()))
    assert handle.busy_slots == 0
    assert record.job.state is JobState.QUEUED and record.job.attempts == 1
    assert "does not hold the job" in (record.events[-1].error.message if record.events[-1].error else "")
    assert link.assignments()  # it was sent, then taken back


def test_a_listed_job_stays_and_a_worker_that_lists_nothing_is_not_reconciled() -> None:
    engine = make_engine()
    connect(engine)
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    handle = engine.workers.get("w1")
    listed = {(record.job.id, record.assignment_id)}
    for _ in range(3):
        now(engine.worker_heartbeat(handle, [], False, listed))
        now(engine.worker_heartbeat(handle, [], False, None))  # an older worker: no list
        now(engine.worker_heartbeat(handle, [], False, set()))  # left out once, between two that list it
    assert record.job.state is JobState.RUNNING and handle.busy_slots == 1


def test_a_second_process_cannot_take_a_live_workers_id_but_its_own_process_can() -> None:
    engine = make_engine()
    connect(engine, instance="first")
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    with pytest.raises(AlreadyExists, match="worker_id: worker 'w1' is already connected"):
        connect(engine, instance="second")
    assert engine.workers.get("w1").info.instance_id == "first"
    connect(engine, instance="first")  # its stream dropped: the new one keeps the job
    handle = engine.workers.get("w1")
    assert record.job.state is JobState.RUNNING and handle.running == {record.job.id: record.assignment_id}


def test_a_silent_workers_id_goes_to_a_new_process_and_its_job_is_requeued() -> None:
    engine = make_engine(lease_timeout_ms=1000)
    connect(engine, instance="dead")
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    engine.workers.get("w1").last_seen = time.monotonic() - 2  # past its lease
    connect(engine, instance="new")
    assert engine.workers.get("w1").info.instance_id == "new"
    assert record.job.state is JobState.QUEUED
    engine.upkeep.dispatch()
    assert record.job.state is JobState.RUNNING and record.job.attempts == 2


def test_models_the_catalog_lacks_are_listed_and_warned() -> None:
    engine = make_engine()
    connect(engine, models=("tiny-sd", "tiny-sdd"))
    handle = engine.workers.get("w1")
    assert handle.snapshot().unknown_models == ["tiny-sdd"]
    assert len(handle.warnings) == 1 and "'tiny-sdd', which the catalog lacks" in handle.warnings[0]


def test_a_job_whose_assignment_still_waits_to_be_written_is_not_judged() -> None:
    # The worker stream is busy writing something big (an assignment with 30 MiB of inputs on a
    # slow link): the worker's heartbeats cannot list what is queued behind it.
    engine = make_engine()
    link = StreamLink()
    info = WorkerInfo(id="w1", execution_mode="legacy_call", slots=1, instance_id="i1")
    now(engine.worker_connected(info, link))
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    handle = engine.workers.get("w1")
    for _ in range(4):
        now(engine.worker_heartbeat(handle, [], False, set()))
    assert record.job.state is JobState.RUNNING and handle.busy_slots == 1, "released before it was sent"
    written = asyncio.run(link.take(1))
    assert written and written[0].WhichOneof("message") == "assignment"
    link.written()
    # Now judged as a job just sent: the next heartbeat may predate it, then two must leave it out.
    for _ in range(2):
        now(engine.worker_heartbeat(handle, [], False, set()))
        assert record.job.state is JobState.RUNNING
    now(engine.worker_heartbeat(handle, [], False, set()))
    assert record.job.state is JobState.QUEUED and handle.busy_slots == 0


def test_a_result_that_comes_on_the_replaced_stream_frees_the_slot_of_the_new_one() -> None:
    engine = make_engine()
    connect(engine, instance="i1")
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    old = engine.workers.get("w1")
    connect(engine, instance="i1")  # the same process on a new stream takes the job over
    new = engine.workers.get("w1")
    assert new is not old and new.busy_slots == 1
    # The result was already on its way up the old stream, which the controller still reads.
    now(engine.worker_result(old, record.assignment_id, record.job.id, None, JobError("INTERNAL", "x")))
    assert record.job.state is JobState.FAILED
    assert new.busy_slots == 0 and new.running == {}


def test_what_waits_for_a_replaced_stream_goes_out_on_the_new_one() -> None:
    engine = make_engine()
    info = WorkerInfo(id="w1", execution_mode="legacy_call", slots=1, instance_id="i1")
    old_link = StreamLink()
    now(engine.worker_connected(info, old_link))
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()  # the assignment waits in the old stream's queue (it was cut meanwhile)
    new_link = StreamLink()
    now(
        engine.worker_connected(
            WorkerInfo(id="w1", execution_mode="legacy_call", slots=1, instance_id="i1"), new_link
        )
    )
    assert asyncio.run(old_link.take(1)) is None, "the old stream writes nothing more"
    resent = asyncio.run(new_link.take(8)) or []
    assert [m.assignment.assignment_id for m in resent] == [record.assignment_id]
    new_link.written()
    handle = engine.workers.get("w1")
    for _ in range(4):  # the worker runs it and says so: no attempt is spent on the reconnect
        now(engine.worker_heartbeat(handle, [], False, {(record.job.id, record.assignment_id)}))
    assert record.job.state is JobState.RUNNING and record.job.attempts == 1


def test_heartbeats_that_come_in_one_batch_count_once() -> None:
    # Heartbeats the worker queued while its stream could not write (the one it built after a
    # preload, the periodic one) may all predate an assignment it has not read yet.
    engine = make_engine()
    link = StreamLink()
    info = WorkerInfo(id="w1", execution_mode="legacy_call", slots=1, instance_id="i1")
    handle = now(engine.worker_connected(info, link))
    record, _ = submit(engine, request())
    engine.upkeep.dispatch()
    asyncio.run(link.take(1))
    link.written()
    gateway = WorkerGateway(engine)
    beat = pb.ConnectRequest(heartbeat=pb.Heartbeat())
    batch = pb.ConnectRequest(batch=pb.ConnectRequestBatch(messages=[beat, beat]))
    asyncio.run(gateway._handle(handle, beat, True))  # may have left before the assignment came
    asyncio.run(gateway._handle(handle, batch, True))  # two at once: left out once, not twice
    assert record.job.state is JobState.RUNNING
    asyncio.run(gateway._handle(handle, beat, True))
    assert record.job.state is JobState.QUEUED
