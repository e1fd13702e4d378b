"""The worker stream's batches and the trace ids of a controller without an exporter.

First a real controller, with this test as the worker speaking `omnirt.worker.v1` by hand, so it
sees exactly what goes over the stream: a worker that says nothing about batches (an older one)
gets one message per assignment, a worker that reads batches gets queued assignments together,
and a worker may answer with several events and the result in one batch. Then the other way
round: a real worker process, with this test as the controller.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest

import omnirt
from omnirt import types as t
from omnirt._internal import catalog_convert
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.controller.core.catalog import Catalog
from omnirt.types import EventKind, JobState
from omnirt.v1 import generation_pb2, generation_pb2_grpc
from tests.daemons import Controller, Worker

JOBS = 12
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class RawWorker:
    """A worker stream driven by the test: Hello, then what the test sends; reads are kept."""

    def __init__(self, address: str, worker_id: str, *, accepts_batches: bool) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outgoing: queue.Queue[pb.ConnectRequest | None] = queue.Queue()
        self.received: queue.Queue[pb.ConnectResponse] = queue.Queue()
        hello = pb.Hello(
            worker_id=worker_id,
            execution_mode="legacy_call",
            backend="cpu",
            models=["null"],
            slots=JOBS,
            accepts_batches=accepts_batches,
        )
        self.outgoing.put(pb.ConnectRequest(hello=hello))
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel).Connect(
            iter(self.outgoing.get, None), timeout=60
        )
        self.reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.reader.start()

    def _read(self, stream: Iterator[pb.ConnectResponse]) -> None:
        try:
            for message in stream:
                self.received.put(message)
        except grpc.RpcError:
            pass  # closed by the test or by the controller; a read that waits for more fails

    def read(self) -> pb.ConnectResponse:
        return self.received.get(timeout=30)

    def send(self, message: pb.ConnectRequest) -> None:
        self.outgoing.put(message)

    def close(self) -> None:
        self.outgoing.put(None)
        self.channel.close()


def _answer(assignment: pb.Assignment) -> pb.ConnectRequest:
    """Every job of `assignment`: a stage event, a progress event and its result, in one batch."""
    messages = []
    for item in assignment.items:
        events = [
            t.JobEvent(job_id=item.job_id, kind=EventKind.STAGE, stage="denoise"),
            t.JobEvent(job_id=item.job_id, kind=EventKind.PROGRESS, progress=t.Progress(1, 1, "denoise")),
        ]
        for event in events:
            event.time = datetime.now(UTC)
            wrapped = pb.AssignmentEvent(
                assignment_id=assignment.assignment_id, event=_convert.event_to_proto(event)
            )
            messages.append(pb.ConnectRequest(event=wrapped))
        artifact = t.Artifact(
            index=0, kind=t.MediaKind.IMAGE, mime_type="image/png", data=b"png", size_bytes=3
        )
        report = t.RunReport(
            job_id=item.job_id, worker_id="raw", model="null", batch_size=len(assignment.items)
        )
        result = t.GenerateResult(job_id=item.job_id, artifacts=[artifact], report=report)
        messages.append(
            pb.ConnectRequest(
                result=pb.AssignmentResult(
                    assignment_id=assignment.assignment_id,
                    job_id=item.job_id,
                    result=_convert.result_to_proto(result),
                )
            )
        )
    return pb.ConnectRequest(batch=pb.ConnectRequestBatch(messages=messages))


def _assignments(worker: RawWorker, jobs: int) -> tuple[list[pb.Assignment], list[str]]:
    """Read until assignments for `jobs` jobs came; returns them and the kind of each stream message."""
    assignments: list[pb.Assignment] = []
    kinds: list[str] = []
    while sum(len(a.items) for a in assignments) < jobs:
        message = worker.read()
        kind = message.WhichOneof("message")
        kinds.append(kind or "")
        inner = list(message.batch.messages) if kind == "batch" else [message]
        assignments += [m.assignment for m in inner if m.WhichOneof("message") == "assignment"]
    return assignments, kinds


@pytest.fixture(scope="module")
def client(controller: Controller) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


def _queue_jobs(client: omnirt.Client) -> list[str]:
    # Each its own step count, so no two share a pipeline call: one assignment per job.
    return [client.submit(model="null", prompt="x", num_inference_steps=i + 1).id for i in range(JOBS)]


def _serve(worker: RawWorker, client: omnirt.Client, job_ids: list[str]) -> list[str]:
    welcome = worker.read()
    assert welcome.WhichOneof("message") == "welcome" and welcome.welcome.accepts_batches
    assignments, kinds = _assignments(worker, len(job_ids))
    assert sorted(i.job_id for a in assignments for i in a.items) == sorted(job_ids)
    for assignment in assignments:
        worker.send(_answer(assignment))
    for job_id in job_ids:
        result = client.wait(job_id, timeout=30)
        assert result.artifacts[0].data == b"png"
    return kinds


def test_a_worker_that_reads_no_batches_gets_one_message_per_assignment(
    controller: Controller, client: omnirt.Client
) -> None:
    job_ids = _queue_jobs(client)  # queued: no worker yet
    worker = RawWorker(controller.address, "raw-old", accepts_batches=False)
    try:
        kinds = _serve(worker, client, job_ids)
    finally:
        worker.close()
    assert kinds == ["assignment"] * JOBS


def test_queued_assignments_reach_a_batch_reading_worker_together_and_batched_answers_count(
    controller: Controller, client: omnirt.Client
) -> None:
    job_ids = _queue_jobs(client)
    worker = RawWorker(controller.address, "raw-new", accepts_batches=True)
    try:
        kinds = _serve(worker, client, job_ids)
    finally:
        worker.close()
    # All were dispatched at once when the worker connected: fewer stream messages than jobs.
    assert "batch" in kinds and len(kinds) < JOBS
    # The events of the batch are the job's, in order, between RUNNING and the result.
    events = list(client.watch(job_ids[0], timeout=10))
    kinds_seen = [(e.kind, e.state) for e in events]
    assert kinds_seen == [
        (EventKind.STATE, JobState.QUEUED),
        (EventKind.STATE, JobState.RUNNING),
        (EventKind.STAGE, None),
        (EventKind.PROGRESS, None),
        (EventKind.RESULT, None),
        (EventKind.STATE, JobState.SUCCEEDED),
    ]


def _submit(stub: Any, metadata: list[tuple[str, str]], steps: int) -> str:
    request = generation_pb2.SubmitRequest(
        request=_convert.request_to_proto(
            t.GenerateRequest(model="null", prompt="x", num_inference_steps=steps)
        )
    )
    return str(stub.Submit(request, metadata=metadata, timeout=10).job.id)


def test_without_an_exporter_jobs_still_carry_the_callers_trace_or_a_new_one(
    controller: Controller, client: omnirt.Client
) -> None:
    """The controller of these tests exports no span; trace ids and the worker's context stay."""
    traceparent = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
    with grpc.insecure_channel(controller.address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        # Twice the same method with and without a caller's trace: nothing carries over.
        job_ids = [
            _submit(stub, [("traceparent", traceparent)], 1),
            _submit(stub, [], 2),
            _submit(stub, [], 3),
        ]
    worker = RawWorker(controller.address, "raw-trace", accepts_batches=True)
    try:
        assert worker.read().WhichOneof("message") == "welcome"
        assignments, _ = _assignments(worker, len(job_ids))
        contexts = {a.items[0].job_id: a.trace_context["traceparent"] for a in assignments}
        for assignment in assignments:
            worker.send(_answer(assignment))
        reports = {job_id: client.wait(job_id, timeout=30).report for job_id in job_ids}
    finally:
        worker.close()
    trace_ids = [reports[job_id].trace_id for job_id in job_ids]
    assert trace_ids[0] == CLIENT_TRACE
    assert len(set(trace_ids)) == 3 and all(len(x) == 32 and int(x, 16) for x in trace_ids)
    for job_id, trace_id in zip(job_ids, trace_ids, strict=True):
        version, context_trace, span_id, flags = contexts[job_id].split("-")
        # The worker's spans hang under the job's trace; sampled, as the SDK would say.
        assert (version, context_trace, flags) == ("00", trace_id, "01") and int(span_id, 16)


class ScriptedController(gateway_pb2_grpc.WorkerGatewayServiceServicer):
    """The controller side played by the test: Welcome, then the messages the test queues."""

    def __init__(self, accepts_batches: bool) -> None:
        self.accepts_batches = accepts_batches
        self.outgoing: queue.Queue[pb.ConnectResponse] = queue.Queue()
        self.received: queue.Queue[pb.ConnectRequest] = queue.Queue()

    def Connect(
        self, request_iterator: Iterator[pb.ConnectRequest], context: Any
    ) -> Iterator[pb.ConnectResponse]:
        half_closed = threading.Event()

        def read() -> None:
            for message in request_iterator:
                self.received.put(message)
            half_closed.set()  # the worker is done (drain): end the stream, as a controller does

        threading.Thread(target=read, daemon=True).start()
        welcome = pb.Welcome(
            worker_id="w-scripted",
            heartbeat_interval_ms=1000,
            lease_timeout_ms=5000,
            accepts_batches=self.accepts_batches,
        )
        yield pb.ConnectResponse(welcome=welcome)
        while context.is_active() and not half_closed.is_set():
            try:
                yield self.outgoing.get(timeout=0.1)
            except queue.Empty:
                continue


def _null_assignment(index: int) -> pb.ConnectResponse:
    spec = Catalog.load(()).resolve("null")
    request = t.GenerateRequest(
        model="null", task=t.Task.TEXT2IMAGE, prompt="x", seed=index, num_inference_steps=2
    )
    item = pb.AssignmentItem(job_id=f"job-{index}", request=_convert.request_to_proto(request), attempt=1)
    assignment = pb.Assignment(
        assignment_id=f"asg-{index}", items=[item], model=catalog_convert.model_to_proto(spec)
    )
    return pb.ConnectResponse(assignment=assignment)


@pytest.fixture
def scripted(request: pytest.FixtureRequest, log_dir: Path, model_dir: Path) -> Iterator[ScriptedController]:
    servicer = ScriptedController(accepts_batches=request.param)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    worker = Worker(log_dir, f"127.0.0.1:{port}", "w-scripted", model_dir, "--models", "null", "--slots", "4")
    worker.start()
    try:
        yield servicer
    finally:
        worker.stop()
        server.stop(0)


def _results(servicer: ScriptedController, count: int) -> tuple[dict[str, pb.AssignmentResult], list[str]]:
    """What the worker sent until `count` results: the results by job id, and each message's kind."""
    results: dict[str, pb.AssignmentResult] = {}
    kinds: list[str] = []
    while len(results) < count:
        message = servicer.received.get(timeout=60)
        kind = message.WhichOneof("message") or ""
        kinds.append(kind)
        for one in message.batch.messages if kind == "batch" else [message]:
            if one.WhichOneof("message") == "result":
                results[one.result.job_id] = one.result
    return results, kinds


@pytest.mark.parametrize("scripted", [False], indirect=True)
def test_a_worker_sends_no_batch_to_a_controller_that_reads_none(scripted: ScriptedController) -> None:
    for index in range(4):
        scripted.outgoing.put(_null_assignment(index))
    results, kinds = _results(scripted, 4)
    assert kinds[0] == "hello" and "batch" not in kinds
    assert kinds.count("event") >= 4 * 3  # stages and progress of every job, one message each
    assert all(r.WhichOneof("outcome") == "result" for r in results.values())


@pytest.mark.parametrize("scripted", [True], indirect=True)
def test_a_worker_runs_every_assignment_of_a_batch(scripted: ScriptedController) -> None:
    batch = pb.ConnectResponseBatch(messages=[_null_assignment(index) for index in range(4)])
    scripted.outgoing.put(pb.ConnectResponse(batch=batch))
    results, kinds = _results(scripted, 4)
    assert kinds[0] == "hello"
    assert sorted(results) == [f"job-{i}" for i in range(4)]
    for index in range(4):
        outcome = results[f"job-{index}"]
        assert outcome.WhichOneof("outcome") == "result", outcome
        assert list(outcome.result.report.seeds) == [index]


def _make_undecodable(message: pb.ConnectResponse, index: int) -> pb.ConnectResponse:
    """`message` made an assignment the worker cannot parse: its `extra` nests deeper than
    protobuf decodes (built in place: protobuf's own copies would refuse to parse it too)."""
    message.CopyFrom(_null_assignment(index))
    value = message.assignment.items[0].request.extra.fields["deep"]
    for _ in range(120):
        value = value.list_value.values.add()
    value.string_value = "bottom"
    return message


@pytest.mark.parametrize("scripted", [True], indirect=True)
def test_an_assignment_the_worker_cannot_decode_fails_that_job_alone_and_keeps_the_stream(
    scripted: ScriptedController,
) -> None:
    # One bad assignment inside a batch of good ones, then one alone, then a good one alone.
    batch = pb.ConnectResponse()
    batch.batch.messages.add().CopyFrom(_null_assignment(0))
    _make_undecodable(batch.batch.messages.add(), 1)
    batch.batch.messages.add().CopyFrom(_null_assignment(2))
    scripted.outgoing.put(batch)
    scripted.outgoing.put(_make_undecodable(pb.ConnectResponse(), 3))
    scripted.outgoing.put(_null_assignment(4))
    results, kinds = _results(scripted, 5)
    assert kinds.count("hello") == 1  # the same stream throughout: no reconnect
    for index in (0, 2, 4):
        assert results[f"job-{index}"].WhichOneof("outcome") == "result", results[f"job-{index}"]
    for index in (1, 3):
        outcome = results[f"job-{index}"]
        assert outcome.assignment_id == f"asg-{index}"
        assert outcome.error.code == "INVALID_ARGUMENT"
        assert "cannot decode" in outcome.error.message


def test_a_result_the_controller_cannot_read_fails_that_job_alone_and_keeps_the_stream(
    controller: Controller, client: omnirt.Client
) -> None:
    bad_job, good_job = _queue_jobs(client)[:2]
    worker = RawWorker(controller.address, "raw-bad-result", accepts_batches=True)
    try:
        assert worker.read().WhichOneof("message") == "welcome"
        assignments, _ = _assignments(worker, JOBS)
        by_job = {a.items[0].job_id: a for a in assignments}
        broken = _answer(by_job[bad_job])
        for message in broken.batch.messages:
            if message.WhichOneof("message") == "result":  # NaN: no JSON, no Struct reader takes it
                message.result.result.report.config_resolved["x"] = float("nan")
        worker.send(broken)
        for job_id, assignment in by_job.items():
            if job_id != bad_job:
                worker.send(_answer(assignment))
        assert client.wait(good_job, timeout=30).artifacts[0].data == b"png"
        failed = client.get_job(bad_job)
        assert failed.state is JobState.FAILED and failed.error is not None
        assert failed.error.code == "INTERNAL" and "cannot read the worker's result" in failed.error.message
        assert "raw-bad-result" in {w.id for w in client.list_workers()}  # the same stream, still there
    finally:
        worker.close()


def test_a_hello_whose_worker_id_no_request_could_name_is_refused(controller: Controller) -> None:
    # A worker's id must fit the bound on ids that requests name (DrainWorker), or it could never
    # be drained; the refusal names the field, as a client's bad request does.
    hello = pb.Hello(worker_id="w" * 300, execution_mode="legacy_call", backend="cpu", slots=1)
    with grpc.insecure_channel(controller.address) as channel:
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(channel).Connect(
            iter([pb.ConnectRequest(hello=hello)]), timeout=10
        )
        with pytest.raises(grpc.RpcError) as caught:
            list(stream)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith("worker_id: at most 256 characters")
