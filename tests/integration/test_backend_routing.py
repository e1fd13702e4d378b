"""Routing by backend: a job labelled `omnirt.backend=B` runs only on workers of backend B.

A real controller (each store) with a real CPU null worker and, beside it, a worker of backend
`cuda` that this test speaks `omnirt.worker.v1` for by hand (this machine has no GPU: the test is
the fake of that hardware only). Pinned jobs go to their backend's worker and never to the other,
the original OmniRT's `backend` (over HTTP) pins the same way, a backend no worker has leaves the
job waiting with the reason, then failing on `--unserved-wait-s` naming the label, while the
other backend's jobs go on.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import httpx
import pytest

import omnirt
from omnirt import errors
from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from tests.daemons import Controller, Worker, job_store, wait_for

LABEL = "omnirt.backend"
FIELD = 'labels["omnirt.backend"]'
CUDA = "w-cuda"


class CudaWorker:
    """A worker of backend `cuda` serving `null`: every assignment it gets is answered at once
    with a result its report names it in; the job ids it ran are kept."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outgoing: queue.Queue[pb.ConnectRequest | None] = queue.Queue()
        self.ran: list[str] = []
        hello = pb.Hello(
            worker_id=CUDA, execution_mode="legacy_call", backend="cuda", models=["null"], slots=4
        )
        self.outgoing.put(pb.ConnectRequest(hello=hello))
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel).Connect(
            iter(self.outgoing.get, None), timeout=120
        )
        self.closed = threading.Event()
        threading.Thread(target=self._serve, args=(stream,), daemon=True).start()
        threading.Thread(target=self._beat, daemon=True).start()

    def _beat(self) -> None:
        while not self.closed.wait(0.5):  # within the controller's lease, as a worker's heartbeat
            self.outgoing.put(pb.ConnectRequest(heartbeat=pb.Heartbeat()))

    def _serve(self, stream: Iterator[pb.ConnectResponse]) -> None:
        try:
            for message in stream:
                batched = message.WhichOneof("message") == "batch"
                for m in list(message.batch.messages) if batched else [message]:
                    if m.WhichOneof("message") == "assignment":
                        self._answer(m.assignment)
        except grpc.RpcError:
            pass  # closed by the test

    def _answer(self, assignment: pb.Assignment) -> None:
        for item in assignment.items:
            self.ran.append(item.job_id)
            artifact = t.Artifact(index=0, kind=t.MediaKind.IMAGE, mime_type="image/png", data=b"png")
            report = t.RunReport(job_id=item.job_id, worker_id=CUDA, model="null", backend="cuda")
            report.finished_at = datetime.now(UTC)
            result = t.GenerateResult(job_id=item.job_id, artifacts=[artifact], report=report)
            answer = pb.AssignmentResult(
                assignment_id=assignment.assignment_id,
                job_id=item.job_id,
                result=_convert.result_to_proto(result),
            )
            self.outgoing.put(pb.ConnectRequest(result=answer))

    def close(self) -> None:
        self.closed.set()
        self.outgoing.put(None)
        self.channel.close()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_pinned_jobs_run_on_their_backends_workers_only(store: str, tmp_path: Path, model_dir: Path) -> None:
    with job_store(store, tmp_path) as flags:
        controller = Controller(tmp_path, *flags, "--unserved-wait-s", "2", http=True).start()
        cpu = Worker(tmp_path, controller.address, "w-cpu", model_dir, "--models", "null").start()
        cuda = CudaWorker(controller.address)
        try:
            with omnirt.Client(controller.address, timeout=60) as client:
                wait_for(lambda: len(client.list_workers()) == 2, 60, "both workers to connect")
                _routes(client, cuda)
                _original_backend_routes(controller.http, cuda)
                with pytest.raises(errors.InvalidRequest) as refused:
                    client.submit(model="null", prompt="x", labels={LABEL: "tpu"})
                assert refused.value.field == FIELD and "cpu, cuda, ascend" in str(refused.value)
                cuda.close()
                wait_for(lambda: len(client.list_workers()) == 1, 30, "the cuda worker to go")
                _unserved_backend_waits_then_fails(client)
        finally:
            cuda.close()
            cpu.stop()
            controller.stop()


def _routes(client: omnirt.Client, cuda: CudaWorker) -> None:
    # Different step counts: no two jobs share a call, each one is placed on its own.
    jobs = {
        backend: [
            client.submit(model="null", prompt="x", num_inference_steps=i + 1, labels={LABEL: backend}).id
            for i in range(6)
        ]
        for backend in ("cuda", "cpu")
    }
    free = [client.submit(model="null", prompt="x", num_inference_steps=i + 1).id for i in range(4)]
    for backend, ids in jobs.items():
        for job_id in ids:
            report = client.wait(job_id, timeout=60).report
            assert report.worker_id == ("w-cpu" if backend == "cpu" else CUDA), (backend, report)
    assert sorted(set(cuda.ran) & set(jobs["cuda"] + jobs["cpu"])) == sorted(jobs["cuda"])
    for job_id in free:  # unpinned: either may take them
        assert client.wait(job_id, timeout=60).report.worker_id in {"w-cpu", CUDA}


def _original_backend_routes(http: str, cuda: CudaWorker) -> None:
    body = {"task": "text2image", "model": "null", "inputs": {"prompt": "hello"}, "config": {"width": 64}}
    with httpx.Client(base_url=http, timeout=60) as h:
        for backend, worker in (("cuda", CUDA), ("cpu-stub", "w-cpu")):
            for _ in range(3):
                r = h.post("/v1/generate", json={**body, "backend": backend})
                assert r.status_code == 200, r.text
                assert r.json()["metadata"]["worker_id"] == worker, r.text


def _unserved_backend_waits_then_fails(client: omnirt.Client) -> None:
    pinned = client.submit(model="null", prompt="x", labels={LABEL: "cuda"})
    job = client.get_job(pinned.id)
    assert job.state is t.JobState.QUEUED
    assert "no connected worker of backend cuda serves model null" in job.waiting_reason, job.waiting_reason
    # The CPU worker goes on serving its jobs meanwhile.
    assert client.generate(model="null", prompt="x", labels={LABEL: "cpu"}).report.worker_id == "w-cpu"
    with pytest.raises(errors.FailedPrecondition) as failed:
        client.wait(pinned.id, timeout=30)
    assert failed.value.field == FIELD and "backend cuda" in str(failed.value), failed.value
