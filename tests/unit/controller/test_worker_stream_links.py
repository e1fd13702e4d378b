"""A worker stream the controller refuses leaves nothing behind in the gateway.

A refused Connect (another live process holds the worker id: ALREADY_EXISTS) used to stay in
the gateway's set of open streams for good: memory a caller could grow by reconnecting, and at
shutdown the controller waited its whole release time for streams that had long ended.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.controller.config import ControllerConfig
from omnirt.controller.server import ControllerServer
from omnirt.testing import free_port


def hello(pid: int) -> pb.ConnectRequest:
    return pb.ConnectRequest(
        hello=pb.Hello(worker_id="w-twin", execution_mode="legacy_call", backend="cpu", slots=1, pid=pid)
    )


async def scenario() -> None:
    address = f"127.0.0.1:{free_port()}"
    server = ControllerServer(ControllerConfig(listen=address, shutdown_grace_s=1))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = gateway_pb2_grpc.WorkerGatewayServiceStub(channel)
            queue: asyncio.Queue[pb.ConnectRequest] = asyncio.Queue()
            await queue.put(hello(1))

            async def requests() -> object:
                while True:
                    yield await queue.get()

            live = stub.Connect(requests())
            first = await live.read()
            assert first.WhichOneof("message") == "welcome"
            for pid in range(2, 12):  # ten other processes claiming the live worker's id
                refused = stub.Connect(iter([hello(pid)]))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await refused.read()
                assert info.value.code() is grpc.StatusCode.ALREADY_EXISTS
            assert len(server.gateway._links) == 1, "only the live stream is held"
            live.cancel()
    finally:
        await server.stop(0)


def test_refused_worker_streams_leave_no_link_behind() -> None:
    asyncio.run(scenario())
