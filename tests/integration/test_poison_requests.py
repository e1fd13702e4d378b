"""Poison requests: the controller refuses what it or a worker could not encode or decode later.

A real controller (memory and Redis stores) and a real worker running the `null` model. Each
bad request goes over real gRPC with the raw stubs (the SDK would refuse to build some of them)
and must answer INVALID_ARGUMENT naming the field, with a bounded message; afterwards ListJobs
and `GET /v1/jobs` still answer, and innocent jobs submitted around the bad ones all succeed on
the same worker (before, one such request broke ListJobs for everyone, or the worker's stream
and with it every job running there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import struct_pb2

import omnirt
from omnirt.errors import FIELD_KEY
from omnirt.types import JobState
from omnirt.v1 import cluster_pb2, cluster_pb2_grpc, generation_pb2, generation_pb2_grpc, types_pb2
from tests.daemons import Controller, Worker, job_store

INT64_MAX = 2**63 - 1
# An error's message names the field, says why and quotes at most a bounded part of the input.
MESSAGE_CHARS = 300


@pytest.fixture(scope="module", params=["memory", "redis"])
def store_args(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[tuple[str, ...]]:
    """Every test of this module runs on both job stores (a real redis-server for the second)."""
    with job_store(request.param, log_dir) as flags:
        yield flags


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path, store_args: tuple[str, ...]) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), *store_args, http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(log_dir, controller.address, "w-poison", model_dir, "--models", "null", "--slots", "2")
    daemon.start()
    controller.wait_worker("w-poison", timeout=120)  # a worker imports torch: slow on a busy machine
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def channel(controller: Controller, worker: Worker) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(controller.address) as ch:
        yield ch


def nested_lists(depth: int) -> list[Any]:
    value: list[Any] = [1]
    for _ in range(depth - 1):
        value = [value]
    return value


def request(**fields: Any) -> types_pb2.GenerateRequest:
    extra = fields.pop("extra", None)
    msg = types_pb2.GenerateRequest(
        model=fields.pop("model", "null"), prompt=fields.pop("prompt", "x"), **fields
    )
    if extra is not None:
        struct = struct_pb2.Struct()
        struct.update(extra)
        msg.extra.CopyFrom(struct)
    return msg


# (what the request is, how to build it, the field the answer must name)
SUBMITS: list[tuple[str, Callable[[], types_pb2.GenerateRequest], str]] = [
    ("timeout_ms int64 max", lambda: request(timeout_ms=INT64_MAX), "timeout_ms"),
    ("deadline_ms int64 max", lambda: request(deadline_ms=INT64_MAX), "deadline_ms"),
    ("extra 48 lists deep", lambda: request(extra={"a": nested_lists(48)}), "extra.a" + "[0]" * 15),
    ("extra Infinity", lambda: request(extra={"x": float("inf")}), "extra.x"),
    ("extra NaN in a list", lambda: request(extra={"a": [1, float("nan")]}), "extra.a[1]"),
    ("extra 1 MiB", lambda: request(extra={"blob": "x" * (1 << 20)}), "extra"),
    ("clip_skip -1", lambda: request(extra={"clip_skip": -1}), "extra.clip_skip"),
    ("guidance_rescale 2", lambda: request(extra={"guidance_rescale": 2}), "extra.guidance_rescale"),
    ("fps NaN", lambda: request(fps=float("nan")), "fps"),
    ("guidance_scale inf", lambda: request(guidance_scale=float("inf")), "guidance_scale"),
    ("prompt 50 MiB", lambda: request(prompt="x" * (50 << 20)), "prompt"),
    ("adapter name 300 chars", lambda: request(adapters=[{"name": "a" * 300}]), "adapters[0].name"),
    ("100 labels", lambda: request(labels={f"k{i}": "v" for i in range(100)}), "labels"),
    ("idempotency key 100 KB", lambda: request(idempotency_key="k" * 100_000), "idempotency_key"),
    ("model name 100 KB", lambda: request(model="m" * 100_000), "model"),
    ("inline inputs 40 MiB", lambda: request(
        task=types_pb2.TASK_IMAGE2IMAGE,
        inputs=[types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_IMAGE, data=b"x" * (40 << 20))],
    ), "inputs"),
]  # fmt: skip


def assert_invalid(call: Callable[[], Any], field: str, what: str = "") -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: Any = caught.value
    said = f"{what or field}: {error.code()} {error.details()[:500]}"
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, said
    assert dict(error.trailing_metadata() or ()).get(FIELD_KEY) == field, said
    assert error.details().startswith(field) and len(error.details()) <= MESSAGE_CHARS, said


def test_poison_requests_are_refused_and_innocent_jobs_run(
    controller: Controller, channel: grpc.Channel
) -> None:
    generation = generation_pb2_grpc.GenerationServiceStub(channel)
    cluster = cluster_pb2_grpc.ClusterServiceStub(channel)
    with omnirt.Client(controller.address, timeout=60) as client:
        # Innocent jobs that run while the bad requests arrive (each step sleeps 50 ms).
        slow = {"num_inference_steps": 10, "extra": {"sleep_ms_per_step": 50}}
        before = [client.submit(model="null", prompt=f"before {i}", **slow) for i in range(3)]  # type: ignore[arg-type]
        for what, build, field in SUBMITS:
            message = build()
            submit = generation_pb2.SubmitRequest(request=message)
            assert_invalid(lambda: generation.Submit(submit), field, f"Submit {what}")  # noqa: B023
            check = generation_pb2.ValidateRequest(request=message)
            assert_invalid(lambda: generation.Validate(check), field, f"Validate {what}")  # noqa: B023
        huge_job = "j" * 100_000
        assert_invalid(lambda: generation.GetJob(generation_pb2.GetJobRequest(job_id=huge_job)), "job_id")
        assert_invalid(
            lambda: generation.CancelJob(generation_pb2.CancelJobRequest(job_id=huge_job)), "job_id"
        )
        drain = cluster_pb2.DrainWorkerRequest(worker_id="w" * 100_000)
        assert_invalid(lambda: cluster.DrainWorker(drain), "worker_id")
        for token in ("-5", "9" * 30):  # a negative offset, one past any list or Redis index
            page = generation_pb2.ListJobsRequest(page_token=token)
            assert_invalid(lambda: generation.ListJobs(page), "page_token", f"page_token {token}")  # noqa: B023

        after = [client.submit(model="null", prompt=f"after {i}", num_inference_steps=2) for i in range(3)]
        innocent = {job.id for job in before + after}
        for job_id in innocent:
            assert client.wait(job_id, timeout=60).artifacts, job_id
        jobs = {j.id: j for j in client.list_jobs(model="null")}  # ListJobs still answers
        for job_id in innocent:
            job = jobs[job_id]
            assert job.state is JobState.SUCCEEDED and job.worker_id == "w-poison", job
        assert set(jobs) == innocent, "a refused request was stored"
    listed = httpx.get(f"{controller.http}/v1/jobs", timeout=30)
    assert listed.status_code == 200, listed.text[:500]
    assert innocent <= {j["id"] for j in listed.json()["jobs"]}
