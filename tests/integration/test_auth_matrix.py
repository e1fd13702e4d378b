"""Every RPC the controller serves, called without a key, with a wrong key, with a user key and
with another tenant's key: the matrix is built from the services the running controller lists
by reflection, so an RPC added later is checked without anyone remembering to add it here.

Real controller (memory and Redis stores) with `--auth-keys`, a real `null` worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import MethodDescriptor
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from omnirt.controller.edges.auth import key_digest
from omnirt.v1 import cluster_pb2, generation_pb2, generation_pb2_grpc, models_pb2, realtime_pb2, types_pb2
from tests.daemons import Controller, Worker, job_store, wait_for

KEYS = {"alice": "alice-key-1", "bob": "bob-key-1", "ops": "ops-admin-key"}
WRONG = "not-a-key-of-anyone"
# Open by design: probes, grpcurl's schema, and the worker stream (admitted by its own token).
OPEN_PREFIXES = ("grpc.health.", "grpc.reflection.", "omnirt.worker.")
ADMIN_SERVICES = {"omnirt.v1.ClusterService"}
# Methods of user services that change what the workers hold: admin keys only.
ADMIN_METHODS = {"omnirt.v1.ModelService.LoadModel", "omnirt.v1.ModelService.UnloadModel"}
MISSING_JOB = "job-that-does-not-exist"
# The services the pool must know (a KeyError below means: import the new one here).
KNOWN_FILES = (cluster_pb2, generation_pb2, models_pb2, realtime_pb2)


def key_file(tmp_path: Path) -> Path:
    lines = []
    for tenant, key in KEYS.items():
        role = "admin" if tenant == "ops" else "user"
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{role}"', f'sha256 = "{key_digest(key)}"', ""]
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(lines))
    return path


def auth(key: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),) if key else ()


@pytest.fixture(scope="module", params=["memory", "redis"])
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Controller, grpc.Channel, str]]:
    """A controller with keys and a null worker, a channel to it, and one job of alice's."""
    log_dir = tmp_path_factory.mktemp(f"auth-{request.param}")
    with job_store(request.param, log_dir) as store:
        controller = Controller(log_dir, *store, "--auth-keys", str(key_file(log_dir))).start()
        worker = Worker(log_dir, controller.address, "w-auth", log_dir / "models", "--models", "null").start()
        channel = grpc.insecure_channel(controller.address)
        try:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            submit = generation_pb2.SubmitRequest(
                request=types_pb2.GenerateRequest(model="null", prompt="alice's secret prompt")
            )
            job = stub.Submit(submit, metadata=auth(KEYS["alice"]), timeout=30).job

            def done() -> bool:
                got = stub.GetJob(generation_pb2.GetJobRequest(job_id=job.id), metadata=auth(KEYS["alice"]))
                return got.job.state == types_pb2.JOB_STATE_SUCCEEDED

            wait_for(done, 60, "alice's job to succeed")
            yield controller, channel, job.id
        finally:
            channel.close()
            worker.stop()
            controller.stop()


def served_methods(channel: grpc.Channel) -> list[MethodDescriptor]:
    """Every method of every service the controller lists by reflection."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = [s.name for reply in replies for s in reply.list_services_response.service]
    pool = descriptor_pool.Default()
    methods = []
    for name in names:
        if name.startswith(OPEN_PREFIXES):
            continue
        methods.extend(pool.FindServiceByName(name).methods)
    return methods


def call(channel: grpc.Channel, method: MethodDescriptor, key: str | None, **fields: Any) -> Any:
    """Call `method` with a request made of `fields`; returns the reply (a list for a stream)."""
    request_type = message_factory.GetMessageClass(method.input_type)
    reply_type = message_factory.GetMessageClass(method.output_type)
    path = f"/{method.containing_service.full_name}/{method.name}"
    request = request_type(**{k: v for k, v in fields.items() if k in request_type.DESCRIPTOR.fields_by_name})
    kwargs = {
        "request_serializer": request_type.SerializeToString,
        "response_deserializer": reply_type.FromString,
    }
    if method.client_streaming:  # a bidirectional stream (RealtimeService.Session): one message
        if not method.server_streaming:
            raise AssertionError(f"{path}: a client-streaming public RPC needs a row in this test")
        stream = channel.stream_stream(path, **kwargs)(iter([request]), metadata=auth(key), timeout=10)
        return [next(iter(stream))]
    if method.server_streaming:
        stream = channel.unary_stream(path, **kwargs)(request, metadata=auth(key), timeout=10)
        return [next(iter(stream))]  # the first message is enough: authorised or not
    return channel.unary_unary(path, **kwargs)(request, metadata=auth(key), timeout=10)


def code_of(
    channel: grpc.Channel, method: MethodDescriptor, key: str | None, **fields: Any
) -> grpc.StatusCode:
    try:
        call(channel, method, key, **fields)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_the_matrix_covers_the_public_services(cluster: tuple[Controller, grpc.Channel, str]) -> None:
    services = {m.containing_service.full_name for m in served_methods(cluster[1])}
    assert {
        "omnirt.v1.GenerationService",
        "omnirt.v1.ModelService",
        "omnirt.v1.ClusterService",
        "omnirt.v1.RealtimeService",
    } <= services


def test_every_rpc_without_a_key_or_with_a_wrong_key_is_unauthenticated(
    cluster: tuple[Controller, grpc.Channel, str],
) -> None:
    controller, channel, job_id = cluster
    for method in served_methods(channel):
        for key in (None, WRONG):
            code = code_of(channel, method, key, job_id=job_id, model="null")
            assert code is grpc.StatusCode.UNAUTHENTICATED, (method.full_name, key, code)
    # Every refusal is in the audit log, and no key ever is.
    audit = [json.loads(line) for line in controller.log().splitlines() if line.startswith('{"time"')]
    refused = [line for line in audit if line["event"] == "auth"]
    assert {line["outcome"] for line in refused} == {"missing_key", "invalid_key"}
    assert all(line["peer"] for line in refused)
    assert WRONG not in controller.log()


def test_admin_rpcs_refuse_user_keys_and_serve_admin_keys(
    cluster: tuple[Controller, grpc.Channel, str],
) -> None:
    channel = cluster[1]
    for method in served_methods(channel):
        user = code_of(channel, method, KEYS["alice"], model="null")
        admin = code_of(channel, method, KEYS["ops"], model="null")
        if method.containing_service.full_name in ADMIN_SERVICES or method.full_name in ADMIN_METHODS:
            assert user is grpc.StatusCode.PERMISSION_DENIED, (method.full_name, user)
        else:
            assert user not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), (
                method.full_name
            )
        assert admin not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED), (
            method.full_name
        )


def _not_found_text(channel: grpc.Channel, method: MethodDescriptor, key: str, job_id: str) -> str:
    try:
        call(channel, method, key, job_id=job_id)
    except grpc.RpcError as exc:
        assert exc.code() is grpc.StatusCode.NOT_FOUND, (method.full_name, exc.code(), exc.details())
        return exc.details().replace(job_id, "ID")
    raise AssertionError(f"{method.full_name}: another tenant's job {job_id} was served")


def test_another_tenants_job_is_not_found_exactly_like_a_missing_one(
    cluster: tuple[Controller, grpc.Channel, str],
) -> None:
    channel, job_id = cluster[1], cluster[2]
    job_methods = [m for m in served_methods(channel) if "job_id" in m.input_type.fields_by_name]
    assert {m.name for m in job_methods} >= {"GetJob", "WatchJob", "CancelJob", "DownloadArtifact"}
    for method in job_methods:
        theirs = _not_found_text(channel, method, KEYS["bob"], job_id)
        missing = _not_found_text(channel, method, KEYS["bob"], MISSING_JOB)
        assert theirs == missing, method.full_name
        # Its owner and an admin still reach it (CancelJob of a finished job is not an error).
        for key in (KEYS["alice"], KEYS["ops"]):
            assert code_of(channel, method, key, job_id=job_id) is grpc.StatusCode.OK, (method.full_name, key)


def test_list_jobs_lists_the_callers_own_jobs(cluster: tuple[Controller, grpc.Channel, str]) -> None:
    channel, job_id = cluster[1], cluster[2]
    stub = generation_pb2_grpc.GenerationServiceStub(channel)

    def listed(key: str) -> list[types_pb2.Job]:
        return list(stub.ListJobs(generation_pb2.ListJobsRequest(), metadata=auth(key), timeout=10).jobs)

    assert job_id not in {j.id for j in listed(KEYS["bob"])}
    mine = {j.id: j for j in listed(KEYS["alice"])}
    assert mine[job_id].tenant == "alice"
    assert all(j.tenant == "alice" for j in mine.values())
    assert job_id in {j.id for j in listed(KEYS["ops"])}


def test_the_job_and_its_run_report_carry_the_tenant(cluster: tuple[Controller, grpc.Channel, str]) -> None:
    channel, job_id = cluster[1], cluster[2]
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    job = stub.GetJob(
        generation_pb2.GetJobRequest(job_id=job_id), metadata=auth(KEYS["alice"]), timeout=10
    ).job
    assert job.tenant == "alice"
    assert job.result.report.tenant == "alice"


def test_idempotency_keys_are_per_tenant(cluster: tuple[Controller, grpc.Channel, str]) -> None:
    stub = generation_pb2_grpc.GenerationServiceStub(cluster[1])
    request = types_pb2.GenerateRequest(model="null", prompt="same", idempotency_key="nightly-1")
    submit = generation_pb2.SubmitRequest(request=request)
    a1 = stub.Submit(submit, metadata=auth(KEYS["alice"]), timeout=10)
    a2 = stub.Submit(submit, metadata=auth(KEYS["alice"]), timeout=10)
    b = stub.Submit(submit, metadata=auth(KEYS["bob"]), timeout=10)
    assert a2.deduplicated and a2.job.id == a1.job.id
    assert not b.deduplicated and b.job.id != a1.job.id and b.job.tenant == "bob"


def test_the_controllers_json_log_names_the_tenant(tmp_path: Path) -> None:
    controller = Controller(tmp_path, "--auth-keys", str(key_file(tmp_path)), "--log-json").start()
    try:
        with grpc.insecure_channel(controller.address) as channel:
            stub = generation_pb2_grpc.GenerationServiceStub(channel)
            submit = generation_pb2.SubmitRequest(request=types_pb2.GenerateRequest(model="null", prompt="x"))
            job = stub.Submit(submit, metadata=auth(KEYS["alice"]), timeout=10).job
            stub.CancelJob(
                generation_pb2.CancelJobRequest(job_id=job.id), metadata=auth(KEYS["alice"]), timeout=10
            )

        def finished() -> list[dict[str, Any]]:
            lines = [json.loads(line) for line in controller.log().splitlines() if line.startswith("{")]
            return [
                line
                for line in lines
                if line.get("job_id") == job.id and "finished" in line.get("message", "")
            ]

        wait_for(lambda: bool(finished()), 10, "the job's 'finished' log line")
        assert finished()[0]["tenant"] == "alice", finished()
    finally:
        controller.stop()


def test_an_admitted_worker_reads_the_catalog_with_its_token_and_clients_cannot(tmp_path: Path) -> None:
    """A worker preloads its models with DescribeModel, and the catalog is behind API keys: the
    worker's token reads it (ModelService's reads only: not LoadModel / UnloadModel); the token
    is no API key for anything else."""
    token = tmp_path / "worker-token"
    token.write_text("worker-secret-token\n")
    keys = str(key_file(tmp_path))
    controller = Controller(tmp_path, "--auth-keys", keys, "--worker-token-file", str(token)).start()
    worker = Worker(tmp_path, controller.address, "w-preload", tmp_path / "models", "--models", "null",
                    "--token-file", str(token), "--preload").start()  # fmt: skip
    try:
        wait_for(lambda: "model null preloaded" in worker.log(), 60, "the worker to preload null")
        assert "does not describe model" not in worker.log()
        with grpc.insecure_channel(controller.address) as channel:
            for method in served_methods(channel):
                code = code_of(channel, method, "worker-secret-token", job_id=MISSING_JOB, model="null")
                if method.full_name in ADMIN_METHODS:  # reading the catalog is all a worker may do
                    assert code is grpc.StatusCode.UNAUTHENTICATED, (method.full_name, code)
                elif method.containing_service.full_name == "omnirt.v1.ModelService":
                    assert code is grpc.StatusCode.OK, method.full_name
                else:
                    assert code is grpc.StatusCode.UNAUTHENTICATED, (method.full_name, code)
    finally:
        worker.stop()
        controller.stop()
