"""What stock gRPC tools see of a real controller: health Watch, reflection v1 and v1alpha,
`google.rpc.Status` error details, corrupt requests, and bounded error texts."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from omnirt import errors
from omnirt.controller.core.bounds import bad
from omnirt.controller.edges.interceptors import ErrorInterceptor
from omnirt.v1 import (
    cluster_pb2,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    types_pb2,
)
from tests.daemons import Controller
from tests.rpc_status import status_details

PUBLIC_SERVICES = [
    generation_pb2.DESCRIPTOR.services_by_name["GenerationService"],
    models_pb2.DESCRIPTOR.services_by_name["ModelService"],
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"],
]


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    """A controller whose queue holds one job (unserved-sd jobs wait there: no worker)."""
    daemon = Controller(log_dir, "--catalog", str(user_catalog), "--max-queue", "1").start()
    yield daemon
    daemon.stop()


@pytest.fixture
def channel(controller: Controller) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(controller.address) as ch:
        yield ch


# ---- health and reflection ------------------------------------------------------------------


def test_health_watch_sends_serving_then_not_serving_on_shutdown(log_dir: Path) -> None:
    daemon = Controller(log_dir).start()
    try:
        with grpc.insecure_channel(daemon.address) as ch:
            request = health_pb2.HealthCheckRequest(service="")
            stream = health_pb2_grpc.HealthStub(ch).Watch(request, timeout=30)
            assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
            daemon.signal(signal.SIGTERM)
            assert next(stream).status == health_pb2.HealthCheckResponse.NOT_SERVING
            stream.cancel()
    finally:
        daemon.stop()


def _reflect(channel: grpc.Channel, version: str, *requests: Any) -> list[Any]:
    """Ask `grpc.reflection.<version>.ServerReflection` (v1 and v1alpha are the same on the wire)."""
    call = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return list(call(iter(requests), timeout=10))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_lists_the_services(channel: grpc.Channel, version: str) -> None:
    (reply,) = _reflect(channel, version, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {s.name for s in reply.list_services_response.service}
    assert {s.full_name for s in PUBLIC_SERVICES} <= names
    assert {
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names


def test_reflection_v1_describes_every_service_it_lists(channel: grpc.Channel) -> None:
    (listing,) = _reflect(channel, "v1", reflection_pb2.ServerReflectionRequest(list_services=""))
    names = [s.name for s in listing.list_services_response.service]
    replies = _reflect(
        channel, "v1", *(reflection_pb2.ServerReflectionRequest(file_containing_symbol=n) for n in names)
    )
    for name, reply in zip(names, replies, strict=True):
        assert reply.HasField("file_descriptor_response"), (name, reply.error_response)


def test_reflection_descriptor_database_finds_the_public_api(channel: grpc.Channel) -> None:
    database = ProtoReflectionDescriptorDatabase(channel)
    assert "omnirt.v1.GenerationService" in database.get_services()
    assert database.FindFileContainingSymbol("omnirt.v1.GenerateRequest").package == "omnirt.v1"


# ---- google.rpc.Status details ---------------------------------------------------------------


def test_invalid_argument_has_bad_request_and_error_info(channel: grpc.Channel) -> None:
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    request = types_pb2.GenerateRequest(model="tiny-sd", prompt="x", width=65)
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(generation_pb2.SubmitRequest(request=request), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = status_details(info.value)
    (violation,) = details["BadRequest"].field_violations
    assert violation.field == "width" and "multiple of 8" in violation.description
    assert details["ErrorInfo"].reason == "INVALID_REQUEST"
    assert details["ErrorInfo"].domain == "omnirt.dev"
    assert details["ErrorInfo"].metadata["field"] == "width"


def test_not_found_names_its_subject(channel: grpc.Channel) -> None:
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.GetJob(generation_pb2.GetJobRequest(job_id="job-nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    error_info = status_details(info.value)["ErrorInfo"]
    assert error_info.reason == "JOB_NOT_FOUND" and error_info.metadata["subject"] == "job"


def test_queue_full_has_retry_info(channel: grpc.Channel) -> None:
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    submit = generation_pb2.SubmitRequest(request=types_pb2.GenerateRequest(model="unserved-sd", prompt="x"))
    first = stub.Submit(submit, timeout=10).job
    try:
        with pytest.raises(grpc.RpcError) as info:
            stub.Submit(submit, timeout=10)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = status_details(info.value)
        assert details["RetryInfo"].retry_delay.ToMilliseconds() == 1000
        assert details["ErrorInfo"].reason == "QUEUE_FULL"
    finally:
        stub.CancelJob(generation_pb2.CancelJobRequest(job_id=first.id), timeout=10)


# ---- requests that are not valid messages ----------------------------------------------------


def _methods() -> list[Any]:
    return [m for s in PUBLIC_SERVICES for m in s.methods]


@pytest.mark.parametrize("method", _methods(), ids=lambda m: m.name)
def test_corrupt_bytes_are_invalid_argument(channel: grpc.Channel, method: Any) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    if method.server_streaming:
        call: Any = channel.unary_stream(path, request_serializer=None, response_deserializer=None)
    else:
        call = channel.unary_unary(path, request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        result = call(b"\xff\xff\xff", timeout=10)
        if method.server_streaming:
            list(result)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details() == f"the request is not a valid {method.input_type.full_name} message"


def test_corrupt_bytes_on_a_request_stream_are_invalid_argument(channel: grpc.Channel) -> None:
    call = channel.stream_stream(
        "/omnirt.worker.v1.WorkerGatewayService/Connect", request_serializer=None, response_deserializer=None
    )
    with pytest.raises(grpc.RpcError) as info:
        list(call(iter([b"\xff\xff\xff"]), timeout=10))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert "not a valid omnirt.worker.v1.ConnectRequest message" in (info.value.details() or "")


# ---- bounded error texts ---------------------------------------------------------------------


def test_a_100_kb_model_name_gets_its_code_and_a_short_message(channel: grpc.Channel) -> None:
    stub = generation_pb2_grpc.GenerationServiceStub(channel)
    request = types_pb2.GenerateRequest(model="m" * 100_000, prompt="x")
    with pytest.raises(grpc.RpcError) as info:
        stub.Submit(generation_pb2.SubmitRequest(request=request), timeout=10)
    assert info.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
    assert len(info.value.details() or "") <= 1100


class _Raising(grpc.GenericRpcHandler):
    """One method, /test.Raise/Call, that raises `self.exc` (for errors no real call makes)."""

    def __init__(self) -> None:
        self.exc: Exception = RuntimeError()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            raise self.exc

        return grpc.unary_unary_rpc_method_handler(call)


def _call_raising(exc: Exception) -> grpc.RpcError:
    """The error a client gets from a grpc.aio server with the ErrorInterceptor whose handler raises."""
    result: list[grpc.RpcError] = []

    async def scenario() -> None:
        raising = _Raising()
        raising.exc = exc
        server = grpc.aio.server(interceptors=[ErrorInterceptor()])
        server.add_generic_rpc_handlers((raising,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                try:
                    await ch.unary_unary("/test.Raise/Call")(b"", timeout=10)
                except grpc.aio.AioRpcError as err:
                    result.append(err)
        finally:
            await server.stop(None)

    asyncio.run(scenario())
    assert result, "the call did not fail"
    return result[0]


@pytest.mark.parametrize("char", ["m", "\U0001f98a"], ids=["ascii", "4-byte"])
def test_huge_error_texts_are_truncated_not_a_lost_status(char: str) -> None:
    err = _call_raising(errors.InvalidRequest(char * 100_000, field="f" * 100_000, retry_after_s=1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    message = err.details() or ""
    assert message.startswith(char * 4) and message.endswith("...") and 200 < len(message.encode()) <= 1024
    for key, value in err.trailing_metadata() or ():
        assert len(value) <= (4096 if key.endswith("-bin") else 512), key
    field = dict(err.trailing_metadata() or ())[errors.FIELD_KEY]
    assert field.startswith("ffff") and field.endswith("...")
    assert status_details(err)["BadRequest"].field_violations[0].field == field


def test_an_unexpected_error_names_its_type_and_a_bounded_message() -> None:
    err = _call_raising(KeyError("k" * 10_000))
    assert err.code() == grpc.StatusCode.INTERNAL
    message = err.details() or ""
    assert message.startswith("internal error: KeyError: 'kkk") and len(message) <= 400


@pytest.mark.parametrize("field", ["a\nb", "a\x00b", "\u00e9\x7f"])
def test_a_field_with_control_characters_keeps_its_status(field: str) -> None:
    # Metadata values must be printable ASCII: a raw newline lost the whole status before
    # (INTERNAL "Invalid metadata"); a worker's JobError field reaches here unchecked.
    err = _call_raising(errors.InvalidRequest("bad field", field=field))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and err.details() == "bad field"
    sent = dict(err.trailing_metadata() or ())[errors.FIELD_KEY]
    assert sent == ascii(field)[1:-1] and sent.isprintable()
    assert errors.from_rpc_error(err).field == sent


def test_the_longest_field_validation_names_arrives_as_named() -> None:
    # Over HTTP the JSON error carries the field as validation cut it; gRPC must say the same.
    error = bad("extra." + "k" * 600, "too deep")
    err = _call_raising(error)
    assert dict(err.trailing_metadata() or ())[errors.FIELD_KEY] == error.field
    assert err.details() == error.message


def test_a_failure_named_ok_is_not_sent_as_ok() -> None:
    # A job's error code comes from a worker: one saying "OK" made the status OK, which grpc
    # cannot abort with, and the caller waited for its deadline (DEADLINE_EXCEEDED, no message).
    err = _call_raising(errors.error_for("OK", "job failed"))
    assert err.code() == grpc.StatusCode.UNKNOWN and err.details() == "job failed"
