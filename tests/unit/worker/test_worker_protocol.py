"""Gateway messages the worker sends and reads, and the pieces of the stream around them."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from omnirt import types as t
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker import protocol
from omnirt.worker.daemon import backoff_delay
from omnirt.worker.outbox import MAX_RESULT_ATTEMPTS, Outbox


def test_importing_the_worker_package_stays_light() -> None:
    code = (
        "import sys, omnirt.worker, omnirt._internal.protocol.v1, omnirt.worker.main, omnirt.worker.daemon;"
        "heavy = [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_hello_and_heartbeat() -> None:
    hello = protocol.hello_message(
        worker_id="w-1",
        execution_mode="legacy_call",
        backend="cpu",
        models=["tiny-sd"],
        slots=2,
        loaded_models=[],
        hostname="host",
        pid=42,
        version="0.1.0",
    )
    assert hello.WhichOneof("message") == "hello"
    assert (hello.hello.worker_id, hello.hello.slots, list(hello.hello.models)) == ("w-1", 2, ["tiny-sd"])
    beat = protocol.heartbeat_message(busy_slots=1, loaded_models=["tiny-sd"], memory_bytes=5, draining=True)
    assert beat.heartbeat.draining and beat.heartbeat.busy_slots == 1


def test_result_and_error_messages() -> None:
    result = t.GenerateResult(
        job_id="j", artifacts=[t.Artifact(0, t.MediaKind.IMAGE, "image/png", data=b"x")]
    )
    msg = protocol.result_message("a", protocol.ItemOutcome("j", result=result))
    assert msg.result.WhichOneof("outcome") == "result"
    assert msg.result.result.artifacts[0].data == b"x"
    err = protocol.result_message("a", protocol.ItemOutcome("j", error=t.JobError("CANCELLED", "stop")))
    assert (err.result.job_id, err.result.error.code) == ("j", "CANCELLED")


def test_event_message_leaves_sequence_to_the_controller() -> None:
    event = t.JobEvent("j", t.EventKind.PROGRESS, progress=t.Progress(2, 4, "denoise"))
    msg = protocol.event_message("a", event)
    assert msg.event.assignment_id == "a"
    assert msg.event.event.sequence == 0
    assert (msg.event.event.progress.step, msg.event.event.progress.total_steps) == (2, 4)


def test_controller_messages() -> None:
    welcome = protocol.controller_message(
        gateway_pb2.ConnectResponse(welcome=gateway_pb2.Welcome(worker_id="w", heartbeat_interval_ms=500))
    )
    assert welcome == protocol.Welcome("w", 500, 0)
    cancel = protocol.controller_message(
        gateway_pb2.ConnectResponse(
            cancel=gateway_pb2.CancelAssignment(job_id="j", reason="DEADLINE_EXCEEDED")
        )
    )
    assert cancel == protocol.CancelRequest("", "j", "DEADLINE_EXCEEDED")
    assert protocol.controller_message(gateway_pb2.ConnectResponse(drain=gateway_pb2.Drain(reason="r"))) == (
        protocol.DrainRequest("r")
    )
    assert protocol.controller_message(gateway_pb2.ConnectResponse()) is None


def test_assignment_from_proto() -> None:
    msg = gateway_pb2.Assignment(
        assignment_id="a",
        model=models_pb2.ModelSpec(id="m", source="builtin:tiny-sd", runtime={"dtype": "float16"}),
        deadline_ms=99,
        batch_group_id="g",
    )
    msg.items.add(
        job_id="j", attempt=2, queue_wait_ms=3.0, request=types_pb2.GenerateRequest(prompt="p", seed=5)
    )
    assignment = protocol.assignment_from_proto(msg)
    assert (assignment.assignment_id, assignment.deadline_ms, assignment.batch_group_id) == ("a", 99, "g")
    assert assignment.model.runtime == {"dtype": "float16"}
    [item] = assignment.items
    assert (item.job_id, item.attempt, item.queue_wait_ms) == ("j", 2, 3.0)
    assert (item.request.prompt, item.request.seed, item.request.width) == ("p", 5, None)
    assert protocol.assignment_job_ids(gateway_pb2.ConnectResponse(assignment=msg)) == ("a", ["j"])


@pytest.mark.parametrize("attempt", range(12))
def test_backoff_grows_is_capped_and_jittered(attempt: int) -> None:
    low = backoff_delay(attempt, cap_s=5.0, rand=lambda: 0.0)
    high = backoff_delay(attempt, cap_s=5.0, rand=lambda: 1.0)
    ceiling = min(5.0, 0.2 * 2**attempt)
    assert (low, high) == pytest.approx((ceiling / 2, ceiling))


def test_outbox_keeps_results_across_a_dropped_stream() -> None:
    async def scenario() -> None:
        box = Outbox()
        box.put("event-1")
        box.put("result-1", durable=True)
        first = await box.get()
        box.sent(first)
        result = await box.get()
        assert box.failed(result)  # the write failed: the result goes back to the front
        box.put("event-2")
        assert box.drop_live() == 1  # disconnected: the event is gone, the result is not
        assert box.durable_pending() == 1
        again = await box.get()
        assert again.message == "result-1"
        box.sent(again)
        await asyncio.wait_for(box.wait_idle(), 1)

    asyncio.run(scenario())


def test_outbox_gives_up_on_a_result_that_never_sends() -> None:
    async def scenario() -> None:
        box = Outbox()
        box.put("result", durable=True)
        for _ in range(MAX_RESULT_ATTEMPTS - 1):
            assert box.failed(await box.get())
        assert not box.failed(await box.get())
        assert box.durable_pending() == 0

    asyncio.run(scenario())


def test_batches_both_ways_keep_their_order() -> None:
    welcome = gateway_pb2.ConnectResponse(welcome=gateway_pb2.Welcome(worker_id="w", accepts_batches=True))
    assert protocol.controller_message(welcome) == protocol.Welcome("w", 0, 0, accepts_batches=True)
    cancels = [gateway_pb2.ConnectResponse(cancel=gateway_pb2.CancelAssignment(job_id=j)) for j in "abc"]
    batch = gateway_pb2.ConnectResponse(batch=gateway_pb2.ConnectResponseBatch(messages=cancels))
    assert [m.cancel.job_id for m in protocol.unbatched(batch)] == ["a", "b", "c"]
    assert protocol.unbatched(cancels[0]) == [cancels[0]]
    events = [protocol.event_message("a", t.JobEvent(j, t.EventKind.STAGE, stage="denoise")) for j in "xy"]
    up = protocol.batch_message(events)
    assert [m.event.event.job_id for m in up.batch.messages] == ["x", "y"]


def test_outbox_hands_out_what_is_queued_together_within_the_limits() -> None:
    async def scenario() -> None:
        box = Outbox()
        for message in ("e1", "r1", "e2", "e3", "big", "e4"):
            box.put(message, durable=message.startswith("r"))
        size = {"big": 100}.get
        taken = await box.get_many(3, 50, lambda m: size(m, 1))
        assert [i.message for i in taken] == ["e1", "r1", "e2"]  # at most 3
        taken2 = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in taken2] == ["e3"]  # "big" would pass 50 bytes: it goes next
        alone = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in alone] == ["big"]  # first in line: taken whatever its size
        for item in (*taken, *taken2, *alone):
            box.sent(item)
        last = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in last] == ["e4"]
        for item in reversed(last):
            box.failed(item)
        assert box.durable_pending() == 0  # an event whose write failed is not kept

    asyncio.run(scenario())


def test_outbox_puts_the_results_of_a_failed_batch_back_in_order() -> None:
    async def scenario() -> None:
        box = Outbox()
        for message in ("r1", "e1", "r2"):
            box.put(message, durable=message.startswith("r"))
        box.put("r3", durable=True)
        batch = await box.get_many(3, 1000, len)
        for item in reversed(batch):
            box.failed(item)
        again = await box.get_many(10, 1000, len)
        assert [i.message for i in again] == ["r1", "r2", "r3"]

    asyncio.run(scenario())


def _deep_assignment(message: gateway_pb2.ConnectResponse, assignment_id: str, job_ids: list[str]) -> None:
    """`message` made an assignment whose requests nest deeper than protobuf parses (built in place)."""
    message.assignment.assignment_id = assignment_id
    for job_id in job_ids:
        item = message.assignment.items.add(job_id=job_id)
        value = item.request.extra.fields["deep"]
        for _ in range(120):
            value = value.list_value.values.add()


def test_controller_messages_parse_each_message_of_a_batch_alone() -> None:
    good = gateway_pb2.ConnectResponse(drain=gateway_pb2.Drain(reason="r"))
    assert protocol.controller_messages(good.SerializeToString()) == [good]
    batch = gateway_pb2.ConnectResponse()
    batch.batch.messages.add().CopyFrom(good)
    _deep_assignment(batch.batch.messages.add(), "a-1", ["j-1", "j-2"])
    batch.batch.messages.add().cancel.job_id = "j-3"
    first, bad, last = protocol.controller_messages(batch.SerializeToString())
    assert first == good and isinstance(last, gateway_pb2.ConnectResponse) and last.cancel.job_id == "j-3"
    assert isinstance(bad, protocol.Undecodable)
    assert (bad.assignment_id, bad.job_ids) == ("a-1", ["j-1", "j-2"]) and "MaxDepth" in bad.reason
    alone = gateway_pb2.ConnectResponse()
    _deep_assignment(alone, "a-2", ["j-4"])
    [undecodable] = protocol.controller_messages(alone.SerializeToString())
    assert isinstance(undecodable, protocol.Undecodable) and undecodable.job_ids == ["j-4"]


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x12\x7f" + b"x" * 3, b"\x0b"])
def test_controller_bytes_that_are_no_message_become_one_undecodable_without_jobs(data: bytes) -> None:
    [undecodable] = protocol.controller_messages(data)
    assert isinstance(undecodable, protocol.Undecodable) and undecodable.job_ids == []


def test_a_batch_written_in_two_parts_is_read_whole_as_protobuf_reads_it() -> None:
    first, second = gateway_pb2.ConnectResponse(), gateway_pb2.ConnectResponse()
    first.batch.messages.add().cancel.job_id = "j-1"
    _deep_assignment(second.batch.messages.add(), "a-2", ["j-2"])
    messages = protocol.controller_messages(first.SerializeToString() + second.SerializeToString())
    assert [getattr(m, "job_ids", None) or [m.cancel.job_id] for m in messages] == [["j-1"], ["j-2"]]
