"""Status codes + trailing metadata -> typed errors, for unary calls, streams and asyncio."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from sdk_fake_server import FakeController

from omnirt import AsyncClient, Client, errors


def test_invalid_argument_carries_the_field(fake: FakeController) -> None:
    fake.fail["Submit"] = errors.InvalidRequest("width: must be a multiple of 8 (got 65)", field="width")
    with Client(fake.address) as client, pytest.raises(errors.InvalidRequest) as info:
        client.submit(model="tiny-sd", prompt="x", width=65)
    assert info.value.field == "width"
    assert info.value.message == "width: must be a multiple of 8 (got 65)"
    assert info.value.__cause__ is None and info.value.__suppress_context__  # no gRPC noise


@pytest.mark.parametrize(
    ("err", "cls"),
    [
        (errors.ModelNotFound("unknown model 'x'"), errors.ModelNotFound),
        (errors.JobNotFound("no job 'x'"), errors.JobNotFound),
        (errors.NotFound("no such thing"), errors.NotFound),
        (errors.DeadlineExceeded("deadline passed in queue"), errors.DeadlineExceeded),
        (errors.Cancelled("cancelled"), errors.Cancelled),
        (errors.FailedPrecondition("model failed to load"), errors.FailedPrecondition),
        (errors.ExecutionFailed("CUDA error"), errors.ExecutionFailed),
        (errors.AlreadyExists("idempotency key reused"), errors.AlreadyExists),
    ],
)
def test_each_code_maps_to_its_class(fake: FakeController, err: errors.OmniRTError, cls: type) -> None:
    fake.fail["Generate"] = err
    with Client(fake.address) as client, pytest.raises(cls) as info:
        client.generate(model="tiny-sd", prompt="x")
    assert type(info.value) is cls
    assert info.value.message == err.message


def test_queue_full_carries_the_retry_hint(fake: FakeController) -> None:
    fake.fail["Submit"] = errors.QueueFull("queue is full (64 jobs)", retry_after_s=1.5)
    with Client(fake.address) as client, pytest.raises(errors.QueueFull) as info:
        client.submit(model="tiny-sd", prompt="x")
    assert info.value.retry_after_s == 1.5


def test_errors_of_streams_are_mapped_too(fake: FakeController) -> None:
    fake.fail["WatchJob"] = errors.JobNotFound("no job 'nope'")
    with Client(fake.address) as client, pytest.raises(errors.JobNotFound):
        list(client.watch("nope"))


def test_server_unavailable_keeps_the_servers_message(fake: FakeController) -> None:
    fake.fail["Generate"] = errors.Unavailable("no worker serves tiny-wan")
    with Client(fake.address) as client, pytest.raises(errors.Unavailable) as info:
        client.generate(model="tiny-wan", prompt="x")
    assert info.value.message == "no worker serves tiny-wan"


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_unreachable_controller_names_its_address() -> None:
    address = _closed_port()
    with Client(address) as client, pytest.raises(errors.Unavailable) as info:
        client.list_models()
    assert info.value.message.startswith(f"cannot reach the controller at {address} (")


def test_asyncio_errors_are_mapped(fake: FakeController) -> None:
    fake.fail["Submit"] = errors.InvalidRequest("prompt: required for text2image", field="prompt")
    fake.fail["WatchJob"] = errors.JobNotFound("no job 'nope'")

    async def scenario() -> None:
        async with AsyncClient(fake.address) as client:
            with pytest.raises(errors.InvalidRequest) as info:
                await client.submit(model="tiny-sd")
            assert info.value.field == "prompt"
            with pytest.raises(errors.JobNotFound):
                async for _ in client.watch("nope"):
                    pass
        address = _closed_port()
        async with AsyncClient(address) as client:
            with pytest.raises(errors.Unavailable, match=f"cannot reach the controller at {address}"):
                await client.list_workers()

    asyncio.run(scenario())


class _DetailsOnly(errors.OmniRTError):
    """An error as another server sends it: the standard google.rpc.Status details (binary,
    not UTF-8), none of OmniRT's own trailers."""

    def __init__(self, code: grpc.StatusCode, message: str, *details: Any) -> None:
        super().__init__(message)
        self.code = code
        status = status_pb2.Status(code=code.value[0], message=message)
        for detail in details:
            status.details.add().Pack(detail)
        self.details_bin = status.SerializeToString()

    def trailing_metadata(self) -> Any:
        return (("grpc-status-details-bin", self.details_bin),)


def test_status_details_alone_give_field_subject_and_retry_hint(fake: FakeController) -> None:
    delay = duration_pb2.Duration(seconds=2, nanos=500_000_000)
    violation = error_details_pb2.BadRequest.FieldViolation(field="width", description="multiple of 8")
    fake.fail["Submit"] = _DetailsOnly(
        grpc.StatusCode.INVALID_ARGUMENT,
        "width: bad",
        error_details_pb2.BadRequest(field_violations=[violation]),
    )
    fake.fail["GetJob"] = _DetailsOnly(
        grpc.StatusCode.NOT_FOUND,
        "no job 'x'",
        error_details_pb2.ErrorInfo(reason="JOB_NOT_FOUND", domain="omnirt.dev", metadata={"subject": "job"}),
    )
    fake.fail["Generate"] = _DetailsOnly(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "queue is full", error_details_pb2.RetryInfo(retry_delay=delay)
    )
    with Client(fake.address) as client:
        with pytest.raises(errors.InvalidRequest) as invalid:
            client.submit(model="tiny-sd", prompt="x")
        assert invalid.value.field == "width"
        with pytest.raises(errors.JobNotFound):
            client.get_job("x")
        with pytest.raises(errors.QueueFull) as full:
            client.generate(model="tiny-sd", prompt="x")
        assert full.value.retry_after_s == 2.5


def test_own_trailers_win_over_status_details_in_binary(fake: FakeController) -> None:
    err = errors.InvalidRequest("width: bad", field="width")
    # A description over 127 bytes: its length prefix is not UTF-8, as in most real details.
    violation = error_details_pb2.BadRequest.FieldViolation(field="height", description="x" * 200)
    details = _DetailsOnly(err.code, err.message, error_details_pb2.BadRequest(field_violations=[violation]))
    both = (*err.trailing_metadata(), *details.trailing_metadata())
    err.trailing_metadata = lambda: both  # type: ignore[method-assign]
    fake.fail["Submit"] = err

    async def scenario() -> None:
        async with AsyncClient(fake.address) as client:
            with pytest.raises(errors.InvalidRequest) as info:
                await client.submit(model="tiny-sd", prompt="x")
            assert info.value.field == "width"

    asyncio.run(scenario())
    with Client(fake.address) as client, pytest.raises(errors.InvalidRequest) as info:
        client.submit(model="tiny-sd", prompt="x")
    assert info.value.field == "width"
