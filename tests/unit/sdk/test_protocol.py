"""The worker protocol's one set of dataclasses and its converter each way (omnirt._internal.protocol).

Every message kind goes through the stream form and back unchanged, both directions, so the
controller and the worker read what the other wrote; then the wire details both sides rely on
(batches, a message a side does not know, the tolerant reader of raw bytes).
"""

from __future__ import annotations

import pytest

from omnirt import types as t
from omnirt._internal import convert as c
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol import messages as m
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2

SPEC = t.ModelSpec(
    id="tiny-sd",
    source="builtin:tiny-sd",
    execution_mode="legacy_call",
    tasks=[t.Task.TEXT2IMAGE],
    runtime={"dtype": "float16"},
)
REQUEST = t.GenerateRequest(model="tiny-sd", task=t.Task.TEXT2IMAGE, prompt="a fox", seed=5, width=64)
RESULT = t.GenerateResult(job_id="j", artifacts=[t.Artifact(0, t.MediaKind.IMAGE, "image/png", data=b"x")])

WORKER_MESSAGES = [
    m.Hello(
        worker_id="w-1",
        execution_mode="legacy_call",
        backend="cpu",
        slots=2,
        models=["tiny-sd"],
        hostname="host",
        pid=42,
        version="0.1.0",
        labels={"zone": "a"},
        instance_id="i-1",
        session_slots=1,
        device="cuda:0,1",
    ),
    m.Heartbeat(
        busy_slots=1,
        loaded_models=["tiny-sd"],
        memory_bytes=5,
        draining=True,
        running={"j-1": "a-1", "j-2": "a-1"},
        sessions=["sess-1"],
        model_bytes={"tiny-sd": 1 << 20},
        jobs_succeeded=7,
        jobs_failed=2,
    ),
    m.AssignmentEvent("a-1", t.JobEvent("j", t.EventKind.PROGRESS, progress=t.Progress(2, 4, "denoise"))),
    m.AssignmentResult("a-1", m.ItemOutcome("j", result=RESULT)),
    m.AssignmentResult("a-1", m.ItemOutcome("j", error=t.JobError("CANCELLED", "stop"))),
    m.ModelLoaded("r-1", "tiny-sd", True, load_ms=12.5, memory_bytes=7),
    m.ModelLoaded("r-2", "tiny-sd", False, t.JobError("FAILED_PRECONDITION", "busy"), unchanged=True),
]

CONTROLLER_MESSAGES = [
    m.Welcome("w-1", 500, 15000, accepts_batches=True, warnings=["a typo"], artifact_store="s3://b/p"),
    m.Assignment(
        assignment_id="a-1",
        model=SPEC,
        items=[m.AssignmentItem("j-1", REQUEST, attempt=2, queue_wait_ms=3.0)],
        deadline_ms=99,
        trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
        batch_group_id="g",
    ),
    m.CancelAssignment("a-1", "j-1", "DEADLINE_EXCEEDED"),
    m.Drain("maintenance"),
    m.SessionOffer(
        session_id="sess-1",
        model=SPEC,
        settings=m.SessionSettings(
            model="tiny-sd",
            inputs=[t.MediaInput(t.MediaRole.IMAGE, data=b"png", mime_type="image/png")],
            video_encoding="jpeg",
            sample_rate=16000,
            fps=25.0,
            labels={"k": "v"},
            config={"seed": 3},
            idle_timeout_ms=1000,
        ),
        deadline_ms=123,
    ),
    m.LoadModel("r-1", SPEC),
    m.UnloadModel("r-2", "tiny-sd", deadline_ms=77),
]


@pytest.mark.parametrize("message", WORKER_MESSAGES, ids=lambda x: type(x).__name__)
def test_a_worker_message_reads_back_as_it_was_written(message: m.WorkerMessage) -> None:
    sent = wire.to_controller(message)
    assert wire.from_worker(gateway_pb2.ConnectRequest.FromString(sent.SerializeToString())) == message


@pytest.mark.parametrize("message", CONTROLLER_MESSAGES, ids=lambda x: type(x).__name__)
def test_a_controller_message_reads_back_as_it_was_written(message: m.ControllerMessage) -> None:
    sent = wire.to_worker(message)
    assert wire.from_controller(gateway_pb2.ConnectResponse.FromString(sent.SerializeToString())) == message


def test_the_wire_keeps_the_fields_older_peers_read() -> None:
    hello = wire.to_controller(WORKER_MESSAGES[0]).hello
    assert (hello.reports_running, hello.loads_models, hello.accepts_batches) == (True, True, True)
    beat = wire.to_controller(WORKER_MESSAGES[1]).heartbeat
    assert {(r.job_id, r.assignment_id) for r in beat.running} == {("j-1", "a-1"), ("j-2", "a-1")}
    event = wire.to_controller(WORKER_MESSAGES[2]).event
    assert event.event.sequence == 0, "the controller numbers events"
    offer = wire.to_worker(CONTROLLER_MESSAGES[4]).session_offer
    assert offer.open.model == "tiny-sd" and offer.open.inputs[0].role == types_pb2.MEDIA_ROLE_IMAGE
    assert offer.open.inputs[0].WhichOneof("source") == "data"


def test_a_session_reference_by_uri_or_bytes() -> None:
    by_uri = m.SessionSettings(inputs=[t.MediaInput(t.MediaRole.IMAGE, uri="file:///x.png")])
    assert (by_uri.reference_image, by_uri.reference_uri) == (None, "file:///x.png")
    inline = m.SessionSettings(inputs=[t.MediaInput(t.MediaRole.IMAGE, data=b"png")])
    assert (inline.reference_image, inline.reference_uri) == (b"png", "")
    assert m.SessionSettings().reference_image is None


def test_an_unreadable_session_offer_fails_the_session_not_the_stream() -> None:
    msg = gateway_pb2.ConnectResponse(
        session_offer=gateway_pb2.SessionOffer(session_id="s", model={"id": "x"})
    )
    msg.session_offer.open.config.fields["nan"].number_value = float("nan")
    offer = wire.from_controller(msg)
    assert isinstance(offer, m.SessionOffer) and offer.error is not None
    assert (offer.session_id, offer.model.id, offer.error.code) == ("s", "x", "INVALID_ARGUMENT")


def test_a_result_without_an_outcome_is_an_internal_error() -> None:
    read = wire.from_worker(gateway_pb2.ConnectRequest(result=gateway_pb2.AssignmentResult(job_id="j")))
    assert isinstance(read, m.AssignmentResult) and read.outcome.error is not None
    assert read.outcome.error.code == "INTERNAL"
    # neither result nor error set: the worker's converter sends an error rather than nothing
    sent = wire.to_controller(m.AssignmentResult("a", m.ItemOutcome("j")))
    assert sent.result.error.code == "INTERNAL"


def test_a_model_refusal_is_bounded_and_has_a_code() -> None:
    answer = gateway_pb2.ModelLoaded(request_id="r", ok=False, error=types_pb2.JobError(message="x" * 5000))
    read = wire.from_worker(gateway_pb2.ConnectRequest(model_loaded=answer))
    assert isinstance(read, m.ModelLoaded) and read.error is not None
    assert (read.error.code, len(read.error.message)) == ("UNKNOWN", 1000)


def test_a_message_kind_this_side_does_not_know_is_none() -> None:
    assert wire.from_controller(gateway_pb2.ConnectResponse()) is None
    assert wire.from_worker(gateway_pb2.ConnectRequest()) is None
    with pytest.raises(TypeError):
        wire.to_worker(m.Hello("w", "legacy_call", "cpu", 1))  # type: ignore[arg-type]  # the wrong direction


def test_a_model_spec_is_encoded_once_per_spec() -> None:
    first = wire.to_worker(m.LoadModel("r", SPEC)).load_model.model
    again = wire.assignment_to_proto(CONTROLLER_MESSAGES[1]).model
    assert first == again and first.runtime["dtype"] == "float16"
    assert wire._SPECS.encoded(SPEC) is wire._SPECS.encoded(SPEC)


def test_batches_both_ways_keep_their_order() -> None:
    cancels = [wire.to_worker(m.CancelAssignment("a", j)) for j in "abc"]
    batch = wire.batch_to_worker(cancels)
    assert [x.cancel.job_id for x in wire.unbatched_responses(batch)] == ["a", "b", "c"]
    assert wire.unbatched_responses(cancels[0]) == [cancels[0]]
    events = [
        wire.to_controller(m.AssignmentEvent("a", t.JobEvent(j, t.EventKind.STAGE, stage="x"))) for j in "xy"
    ]
    up = wire.batch_to_controller(events)
    assert [x.event.event.job_id for x in wire.unbatched_requests(up)] == ["x", "y"]
    nested = gateway_pb2.ConnectRequest()
    nested.batch.messages.add().CopyFrom(up)  # a bad worker nests a batch: never read
    assert wire.unbatched_requests(nested) == []


def test_assignment_ids_are_read_without_converting_the_requests() -> None:
    msg = wire.to_worker(CONTROLLER_MESSAGES[1])
    assert wire.assignment_job_ids(msg) == ("a-1", ["j-1"])
    assert wire.assignment_job_ids(wire.to_worker(m.Drain())) == ("", [])


def _deep_assignment(message: gateway_pb2.ConnectResponse, assignment_id: str, job_ids: list[str]) -> None:
    """`message` made an assignment whose requests nest deeper than protobuf parses (built in place)."""
    message.assignment.assignment_id = assignment_id
    message.assignment.model.CopyFrom(models_pb2.ModelSpec(id="m"))
    for job_id in job_ids:
        item = message.assignment.items.add(job_id=job_id)
        value = item.request.extra.fields["deep"]
        for _ in range(120):
            value = value.list_value.values.add()


def test_controller_messages_parse_each_message_of_a_batch_alone() -> None:
    good = gateway_pb2.ConnectResponse(drain=gateway_pb2.Drain(reason="r"))
    assert wire.controller_messages(good.SerializeToString()) == [good]
    batch = gateway_pb2.ConnectResponse()
    batch.batch.messages.add().CopyFrom(good)
    _deep_assignment(batch.batch.messages.add(), "a-1", ["j-1", "j-2"])
    batch.batch.messages.add().cancel.job_id = "j-3"
    first, bad, last = wire.controller_messages(batch.SerializeToString())
    assert first == good and isinstance(last, gateway_pb2.ConnectResponse) and last.cancel.job_id == "j-3"
    assert isinstance(bad, wire.Undecodable)
    assert (bad.assignment_id, bad.job_ids) == ("a-1", ["j-1", "j-2"]) and "MaxDepth" in bad.reason
    alone = gateway_pb2.ConnectResponse()
    _deep_assignment(alone, "a-2", ["j-4"])
    [undecodable] = wire.controller_messages(alone.SerializeToString())
    assert isinstance(undecodable, wire.Undecodable) and undecodable.job_ids == ["j-4"]


@pytest.mark.parametrize("data", [b"\xff\xff\xff", b"\x12\x7f" + b"x" * 3, b"\x0b"])
def test_controller_bytes_that_are_no_message_become_one_undecodable_without_jobs(data: bytes) -> None:
    [undecodable] = wire.controller_messages(data)
    assert isinstance(undecodable, wire.Undecodable) and undecodable.job_ids == []


def test_a_batch_written_in_two_parts_is_read_whole_as_protobuf_reads_it() -> None:
    first, second = gateway_pb2.ConnectResponse(), gateway_pb2.ConnectResponse()
    first.batch.messages.add().cancel.job_id = "j-1"
    _deep_assignment(second.batch.messages.add(), "a-2", ["j-2"])
    messages = wire.controller_messages(first.SerializeToString() + second.SerializeToString())
    assert [getattr(x, "job_ids", None) or [x.cancel.job_id] for x in messages] == [["j-1"], ["j-2"]]


def test_an_item_whose_request_is_encoded_already_goes_as_those_bytes() -> None:
    encoded = c.request_to_proto(REQUEST).SerializeToString()
    item = m.AssignmentItem("j", t.GenerateRequest(model="stale"), encoded_request=encoded)
    sent = wire.to_worker(m.Assignment("a", SPEC, [item]))
    assert sent.assignment.items[0].request.SerializeToString() == encoded
    read = wire.from_controller(gateway_pb2.ConnectResponse.FromString(sent.SerializeToString()))
    assert isinstance(read, m.Assignment)
    assert read.items[0].request == REQUEST and read.items[0].encoded_request == b""
