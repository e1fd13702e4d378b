"""Status codes + trailing metadata -> typed errors, for unary calls, streams and asyncio."""

from __future__ import annotations

import asyncio
import socket

import pytest
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
