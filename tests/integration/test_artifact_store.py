"""The S3-compatible artifact store through real daemons: a controller (memory and Redis
engines) and a `null` worker, both with `--artifact-store s3://omnirt-test/arts`, against a real
S3 server process on loopback (moto's, `omnirt.testing.S3Server`).

What a user sees: the objects are in the bucket under `arts/JOB_ID/`, uploaded in parts (the
worker's multipart threshold is 1 byte here); the result carries presigned URLs that fetch the
same bytes as DownloadArtifact, the SDK's save and the HTTP route; another tenant gets
NOT_FOUND; the objects go when the job expires; with the store down the job still succeeds,
its bytes come through the controller and the report says so; a bad `--artifact-store` keeps
either daemon from starting.
"""

from __future__ import annotations

import hashlib
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import grpc
import pytest

from omnirt._internal.object_store import ObjectStore, StoreLocation, StoreSettings
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.controller.edges.auth import key_digest
from omnirt.testing import S3Server
from omnirt.v1 import generation_pb2, generation_pb2_grpc, types_pb2
from tests.daemons import Controller, Worker, job_store, wait_for

BUCKET = "omnirt-test"
STORE = f"s3://{BUCKET}/arts"
JOB_TTL_S = 8
KEYS = {"alice": "alice-key", "bob": "bob-key", "ops": "ops-admin-key"}
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "omnirt-test",
    "AWS_SECRET_ACCESS_KEY": "omnirt-test-secret",
    "AWS_REGION": "us-east-1",
}


# A model only the test's raw worker serves (the real worker serves `null`).
RAW_CATALOG = """
[[models]]
id = "null-raw"
family = "null"
tasks = ["text2image"]
source = "builtin:null"
pipeline_class = "NullPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 1
"""


def auth(tenant: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {KEYS[tenant]}"),)


@pytest.fixture(scope="module")
def aws_env() -> Iterator[None]:
    """Credentials for moto (it takes any), in the daemons' environment too."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in AWS_ENV.items():
            patch.setenv(name, value)
        patch.delenv("AWS_PROFILE", raising=False)
        patch.delenv("AWS_ENDPOINT_URL", raising=False)
        yield


@pytest.fixture(scope="module")
def s3(log_dir: Path, aws_env: None) -> Iterator[S3Server]:
    server = S3Server(log_dir).start()
    make_bucket(server)
    yield server
    server.stop()


def s3_client(server: S3Server) -> Any:
    return boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1")


def make_bucket(server: S3Server) -> None:
    s3_client(server).create_bucket(Bucket=BUCKET)


def keys_of(server: S3Server, job_id: str) -> list[str]:
    listing = s3_client(server).list_objects_v2(Bucket=BUCKET, Prefix=f"arts/{job_id}/")
    return sorted(o["Key"] for o in listing.get("Contents", []))


@pytest.fixture(scope="module", params=["memory", "redis"])
def controller(request: pytest.FixtureRequest, log_dir: Path, s3: S3Server) -> Iterator[Controller]:
    lines = [f'[[keys]]\ntenant = "{t}"\nsha256 = "{key_digest(k)}"\n' for t, k in KEYS.items()]
    lines.append('role = "admin"\n')  # ops, the last: ListWorkers (wait_worker) is for admins
    keys = log_dir / "keys.toml"
    keys.write_text("\n".join(lines))
    catalog = log_dir / "raw.toml"
    catalog.write_text(RAW_CATALOG)
    with job_store(request.param, log_dir) as store_args:
        daemon = Controller(
            log_dir,
            *store_args,
            "--auth-keys",
            str(keys),
            "--catalog",
            str(catalog),
            "--artifact-store",
            STORE,
            "--artifact-store-endpoint",
            s3.endpoint,
            "--artifact-store-sweep-s",
            "0.5",
            "--job-ttl-s",
            str(JOB_TTL_S),
            "--inline-limit-bytes",
            "100000",
            http=True,
            api_key=KEYS["ops"],
        ).start()
        yield daemon
        daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path, s3: S3Server) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-s3",
        model_dir,
        "--models",
        "null",
        "--artifact-store",
        STORE,
        # Every output uploads in parts, however small (parts are at least 5 MiB: one part here).
        "--artifact-store-multipart-threshold-bytes",
        "1",
    )
    daemon.env["AWS_ENDPOINT_URL"] = s3.endpoint  # the usual AWS way, instead of the flag
    daemon.start()
    controller.wait_worker("w-s3")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def stub(controller: Controller) -> Iterator[generation_pb2_grpc.GenerationServiceStub]:
    with grpc.insecure_channel(controller.address) as channel:
        yield generation_pb2_grpc.GenerationServiceStub(channel)


def generate(
    stub: generation_pb2_grpc.GenerationServiceStub, tenant: str = "alice", outputs: int = 2
) -> generation_pb2.GenerateResponse:
    request = types_pb2.GenerateRequest(model="null", prompt="s3", num_outputs=outputs, seed=7)
    response: generation_pb2.GenerateResponse = stub.Generate(request, metadata=auth(tenant), timeout=60)
    assert response.job.state == types_pb2.JOB_STATE_SUCCEEDED, response.job.error
    return response


def download(stub: generation_pb2_grpc.GenerationServiceStub, job_id: str, index: int, tenant: str) -> bytes:
    request = generation_pb2.DownloadArtifactRequest(job_id=job_id, index=index)
    return b"".join(r.chunk for r in stub.DownloadArtifact(request, metadata=auth(tenant), timeout=30))


def test_outputs_live_in_the_bucket_with_presigned_urls(
    controller: Controller, worker: Worker, stub: Any, s3: S3Server, tmp_path: Path
) -> None:
    response = generate(stub)
    job_id = response.job.id
    artifacts = response.result.artifacts
    assert len(artifacts) == 2
    assert response.result.report.warnings == []
    keys = keys_of(s3, job_id)
    assert keys == sorted(f"arts/{job_id}/{a.index}-{a.file_name}" for a in artifacts)
    for a in artifacts:
        assert a.object_uri == f"{STORE}/{job_id}/{a.index}-{a.file_name}"
        assert a.data == b""  # the bytes never crossed the controller
        assert a.uri == f"omnirt://jobs/{job_id}/artifacts/{a.index}"
        assert a.url.startswith(s3.endpoint + f"/{BUCKET}/arts/{job_id}/")
        # Valid as long as the job, not longer.
        now_ms = time.time() * 1000
        assert now_ms < a.url_expires_at_ms <= now_ms + JOB_TTL_S * 1000 + 1000
        with urllib.request.urlopen(a.url, timeout=10) as answer:  # no credentials: the URL is signed
            fetched = answer.read()
        assert hashlib.sha256(fetched).hexdigest() == a.sha256
        assert len(fetched) == a.size_bytes
        assert download(stub, job_id, a.index, "alice") == fetched
        head = s3_client(s3).head_object(Bucket=BUCKET, Key=f"arts/{job_id}/{a.index}-{a.file_name}")
        assert head["ETag"].strip('"').endswith("-1")  # a multipart upload's ETag: md5-PARTS
        assert head["ContentType"] == a.mime_type


def test_sdk_and_http_read_objects(controller: Controller, worker: Worker, stub: Any, tmp_path: Path) -> None:
    response = generate(stub, outputs=1)
    job_id = response.job.id
    client = controller.client(api_key=KEYS["alice"])
    try:
        result = client.get_job(job_id).result
        assert result is not None and result.artifacts[0].url and not result.artifacts[0].data
        saved = client.save(result, tmp_path)
    finally:
        client.close()
    assert hashlib.sha256(saved[0].read_bytes()).hexdigest() == result.artifacts[0].sha256
    url = f"{controller.http}/v1/jobs/{job_id}/artifacts/0"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEYS['alice']}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert hashlib.sha256(answer.read()).hexdigest() == result.artifacts[0].sha256
        assert answer.headers["Content-Type"] == result.artifacts[0].mime_type


def test_another_tenant_gets_not_found(controller: Controller, worker: Worker, stub: Any) -> None:
    job_id = generate(stub, outputs=1).job.id
    with pytest.raises(grpc.RpcError) as caught:
        download(stub, job_id, 0, "bob")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    request = urllib.request.Request(
        f"{controller.http}/v1/jobs/{job_id}/artifacts/0", headers={"Authorization": f"Bearer {KEYS['bob']}"}
    )
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(request, timeout=10)
    assert http_error.value.code == 404
    assert len(download(stub, job_id, 0, "alice")) > 0  # the owner still reads it


def test_objects_go_with_the_job(controller: Controller, worker: Worker, stub: Any, s3: S3Server) -> None:
    job_id = generate(stub, outputs=1).job.id
    assert keys_of(s3, job_id)
    wait_for(lambda: not keys_of(s3, job_id), JOB_TTL_S + 15, "the expired job's objects to be deleted")
    with pytest.raises(grpc.RpcError) as caught:  # the job is gone as well (TTL)
        stub.GetJob(generation_pb2.GetJobRequest(job_id=job_id), metadata=auth("alice"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_store_down_the_job_still_succeeds(
    controller: Controller, worker: Worker, stub: Any, s3: S3Server
) -> None:
    stored = generate(stub, outputs=1)  # in the store, before it goes down
    s3.stop()
    try:
        with pytest.raises(grpc.RpcError) as caught:  # its bytes cannot be had now: said so, and where
            download(stub, stored.job.id, 0, "alice")
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert stored.result.artifacts[0].object_uri in (caught.value.details() or "")
        response = generate(stub, outputs=1)
        artifact = response.result.artifacts[0]
        assert artifact.object_uri == "" and artifact.url == ""
        assert artifact.data  # through the controller, inline (below --inline-limit-bytes)
        assert hashlib.sha256(artifact.data).hexdigest() == artifact.sha256
        warnings = list(response.result.report.warnings)
        assert any(
            f"artifact store {STORE} unreachable" in w and "0 went through the controller" in w
            for w in warnings
        )
        assert download(stub, response.job.id, 0, "alice") == artifact.data
    finally:
        s3.start()  # back, empty, on the same port
        make_bucket(s3)
    # Back up: the next job's outputs go to the store again.
    assert generate(stub, outputs=1).result.artifacts[0].object_uri


def test_large_objects_upload_in_parts(s3: S3Server) -> None:
    """6 MiB over a 1-byte threshold: two parts (5 MiB, S3's least, and the rest), read back whole."""
    store = ObjectStore(
        StoreSettings(StoreLocation.parse(STORE), endpoint=s3.endpoint, multipart_threshold_bytes=1)
    )
    data = os.urandom(6 * 1024 * 1024)
    store.upload("arts/job-big/0-big.mp4", data, "video/mp4")
    head = s3_client(s3).head_object(Bucket=BUCKET, Key="arts/job-big/0-big.mp4")
    assert head["ETag"].strip('"').endswith("-2")
    assert b"".join(store.read("arts/job-big/0-big.mp4")) == data
    assert store.delete_job("job-big") == 1


class RawWorker:
    """A worker stream driven by the test (a worker that sends what it likes)."""

    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self.outgoing: queue.Queue[pb.ConnectRequest | None] = queue.Queue()
        self.received: queue.Queue[pb.ConnectResponse] = queue.Queue()
        hello = pb.Hello(
            worker_id="w-raw", execution_mode="legacy_call", backend="cpu", models=["null-raw"], slots=1
        )
        self.outgoing.put(pb.ConnectRequest(hello=hello))
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel).Connect(
            iter(self.outgoing.get, None), timeout=60
        )
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        try:
            for message in stream:
                self.received.put(message)
        except grpc.RpcError:
            pass

    def read(self, kind: str) -> Any:
        while True:
            message = self.received.get(timeout=30)
            if message.WhichOneof("message") == kind:
                return getattr(message, kind)

    def close(self) -> None:
        self.outgoing.put(None)
        self.channel.close()


def test_a_worker_cannot_point_a_job_at_another_jobs_object(
    controller: Controller, worker: Worker, stub: Any, s3: S3Server
) -> None:
    victim = generate(stub, tenant="bob", outputs=1)
    raw = RawWorker(controller.address)
    try:
        assert raw.read("welcome").artifact_store == STORE  # the store is named to workers
        request = types_pb2.GenerateRequest(model="null-raw", prompt="rogue")
        job_id = stub.Submit(
            generation_pb2.SubmitRequest(request=request), metadata=auth("alice"), timeout=30
        ).job.id
        assignment = raw.read("assignment")
        stolen = victim.result.artifacts[0].object_uri  # bob's object, claimed for alice's job
        artifact = types_pb2.Artifact(index=0, mime_type="image/png", size_bytes=10, object_uri=stolen)
        artifact.url = "https://evil.example/x"  # a worker never sets the URL either
        result = types_pb2.GenerateResult(job_id=job_id, artifacts=[artifact])
        raw.outgoing.put(
            pb.ConnectRequest(
                result=pb.AssignmentResult(
                    assignment_id=assignment.assignment_id, job_id=job_id, result=result
                )
            )
        )
        get = generation_pb2.GetJobRequest(job_id=job_id)
        wait_for(
            lambda: (
                stub.GetJob(get, metadata=auth("alice"), timeout=10).job.state == types_pb2.JOB_STATE_FAILED
            ),
            30,
            "the rogue result to fail its job",
        )
        job = stub.GetJob(get, metadata=auth("alice"), timeout=10).job
        assert job.error.code == "INTERNAL"
        assert f"is not an object of job {job_id}" in job.error.message
    finally:
        raw.close()
    # Bob's object is untouched and still his.
    assert (
        download(stub, victim.job.id, 0, "bob")
        == urllib.request.urlopen(victim.result.artifacts[0].url, timeout=10).read()
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gs://bucket/prefix", "must be s3://BUCKET[/PREFIX]"),
        ("s3:///prefix", "names no bucket"),  # the rest: tests/unit/sdk/test_object_store.py
    ],
)
@pytest.mark.parametrize("daemon", ["controller", "worker"])
def test_bad_store_refuses_to_start(daemon: str, value: str, message: str) -> None:
    argv = [sys.executable, "-m", f"omnirt.{daemon}.main", "--artifact-store", value]
    if daemon == "controller":
        argv += ["--listen", "127.0.0.1:0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ})
    assert done.returncode == 2
    assert message in done.stderr and "artifact-store" in done.stderr
