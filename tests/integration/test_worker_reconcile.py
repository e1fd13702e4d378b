"""A controller killed mid-job and restarted: its worker adopts the job it is offered again, and
the controller's view of the worker's slots heals from what the worker says it runs.

Real `redis-server`, real controllers (one `kill -9`ed and restarted on its port) and a real
`null` worker; then this test as a worker speaking `omnirt.worker.v1` by hand (as in
test_worker_stream_batches), one that never lists the job it was given.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import omnirt
from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.types import EventKind, JobState
from tests.daemons import Controller, RedisServer, Worker, job_store, wait_for

# About 16 s of steps: long enough to outlive a kill, a lease expiry and a restart.
SLOW_NULL = {"model": "null", "num_inference_steps": 320, "extra": {"sleep_ms_per_step": 50}}


@pytest.fixture
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    yield server
    server.stop()


def busy_slots(controller: Controller, worker_id: str) -> int:
    return sum(w.busy_slots for w in controller.workers() if w.id == worker_id)


def test_a_job_requeued_after_its_controller_crashed_is_adopted_by_the_worker_still_running_it(
    redis_server: RedisServer, log_dir: Path, model_dir: Path
) -> None:
    store = ("--store", redis_server.url, "--lease-timeout-ms", "2000", "--heartbeat-interval-ms", "500")
    first = Controller(log_dir, *store).start()
    other = Controller(log_dir, *store).start()  # no worker: it only requeues the dead one's job
    worker = Worker(
        log_dir, first.address, "w-adopt", model_dir, "--models", "null", "--reconnect-max-s", "0.5"
    ).start()
    try:
        first.wait_worker("w-adopt")
        with omnirt.Client(other.address, timeout=10) as client:
            job = client.submit(prompt="outlives its controller", **SLOW_NULL)
            for event in client.watch(job.id, timeout=60):
                if event.kind is EventKind.PROGRESS:
                    break  # running on w-adopt
            first.signal(signal.SIGKILL)
            first.wait(10)
            wait_for(lambda: client.get_job(job.id).state is JobState.QUEUED, 30, "the lease to expire")
            first.start()  # same port: the worker reconnects to it and is offered the job again
            client.wait(job.id, timeout=90)
            final = client.get_job(job.id)
            assert final.state is JobState.SUCCEEDED, final.error
            assert final.attempts == 2
            assert sum(1 for e in client.watch(job.id) if e.kind is EventKind.RESULT) == 1
            wait_for(lambda: busy_slots(first, "w-adopt") == 0, 10, "the worker's slot to be free")
            after = client.generate(model="null", prompt="next", num_inference_steps=2, timeout=30)
            assert after.report.worker_id == "w-adopt"
    finally:
        worker.stop()
        other.stop()
        if first.alive():
            first.stop()


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[tuple[str, ...]]:
    with job_store(request.param, log_dir) as flags:
        yield flags


class ForgetfulWorker:
    """A hand-driven worker stream whose heartbeats list no job, whatever it was given."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outgoing: queue.Queue[pb.ConnectRequest | None] = queue.Queue()
        self.assignments: queue.Queue[pb.Assignment] = queue.Queue()
        hello = pb.Hello(
            worker_id="w-forgetful",
            execution_mode="legacy_call",
            backend="cpu",
            models=["null"],
            slots=1,
            instance_id="forgetful-1",
            reports_running=True,
        )
        self.outgoing.put(pb.ConnectRequest(hello=hello))
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel).Connect(
            iter(self.outgoing.get, None), timeout=120
        )
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Iterator[pb.ConnectResponse]) -> None:
        try:
            for message in stream:
                if message.WhichOneof("message") == "assignment":
                    self.assignments.put(message.assignment)
        except grpc.RpcError:
            pass

    def heartbeat(self) -> None:
        self.outgoing.put(pb.ConnectRequest(heartbeat=pb.Heartbeat()))

    def succeed(self, assignment: pb.Assignment) -> None:
        job_id = assignment.items[0].job_id
        report = t.RunReport(job_id=job_id, worker_id="w-forgetful", model="null")
        result = _convert.result_to_proto(t.GenerateResult(job_id=job_id, report=report))
        answer = pb.AssignmentResult(assignment_id=assignment.assignment_id, job_id=job_id, result=result)
        self.outgoing.put(pb.ConnectRequest(result=answer))

    def close(self) -> None:
        self.outgoing.put(None)
        self.channel.close()


def beat(controller: Controller, worker: ForgetfulWorker) -> None:
    """One heartbeat, and until the controller has read it (its time in ListWorkers moves)."""

    def heard() -> list[int]:
        return [w.last_heartbeat_at.ToNanoseconds() for w in controller.workers() if w.id == "w-forgetful"]

    before = heard()
    worker.heartbeat()
    wait_for(lambda: heard() != before, 30, "the controller to read the heartbeat")


def test_a_job_its_worker_does_not_list_goes_back_to_the_queue_and_frees_the_slot(
    store: tuple[str, ...], log_dir: Path
) -> None:
    controller = Controller(log_dir, *store, "--lease-timeout-ms", "60000").start()
    worker = ForgetfulWorker(controller.address)
    try:
        controller.wait_worker("w-forgetful")
        with omnirt.Client(controller.address, timeout=10) as client:
            job = client.submit(model="null", prompt="forgotten")
            first = worker.assignments.get(timeout=30)
            assert client.get_job(job.id).state is JobState.RUNNING
            beat(controller, worker)  # may have left before the assignment came: not judged
            beat(controller, worker)  # left out once: not enough
            assert client.get_job(job.id).state is JobState.RUNNING
            assert worker.assignments.empty()
            # Left out twice in a row: released (one more heartbeat, where the controller saw the
            # assignment written only after the first one came: a loaded machine).
            for _ in range(2):
                beat(controller, worker)
                with contextlib.suppress(queue.Empty):
                    second = worker.assignments.get(timeout=5)  # requeued, the slot free again
                    break
            else:
                raise AssertionError("the job the worker does not list was not released")
            assert second.items[0].job_id == job.id and second.assignment_id != first.assignment_id
            assert second.items[0].attempt == 2
            worker.succeed(second)
            client.wait(job.id, timeout=30)
            events = list(client.watch(job.id))
            requeued = [e for e in events if e.state is JobState.QUEUED and e.error]
            assert requeued and "does not hold the job" in requeued[0].error.message
            assert client.get_job(job.id).state is JobState.SUCCEEDED
            wait_for(lambda: busy_slots(controller, "w-forgetful") == 0, 10, "a free slot")
    finally:
        worker.close()
        controller.stop()
