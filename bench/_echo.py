"""The ceiling: a bare grpc.aio unary call relayed through two hops, with no OmniRT code.

`python -m bench._echo worker --listen ADDR --response-bytes N` answers every call with N bytes;
`python -m bench._echo relay --listen ADDR --upstream ADDR` forwards each call to the worker and
returns its answer. Messages are raw bytes (no protobuf), so what is left is gRPC and asyncio.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

import grpc

METHOD = "/bench.Echo/Call"
SERVICE = "bench.Echo"


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, behaviour: Any) -> None:
        self._handler = grpc.unary_unary_rpc_method_handler(behaviour)

    def service(self, handler_call_details: Any) -> Any:
        return self._handler if handler_call_details.method == METHOD else None


async def serve(listen: str, behaviour: Any) -> None:
    """Serve `behaviour` (an async unary handler on bytes) until SIGTERM or SIGINT."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_Handler(behaviour)])
    server.add_insecure_port(listen)
    await server.start()
    print(f"echo listening on {listen}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(1)


async def run_worker(listen: str, response_bytes: int) -> None:
    answer = b"x" * response_bytes

    async def call(request: bytes, context: Any) -> bytes:
        return answer

    await serve(listen, call)


async def run_relay(listen: str, upstream: str) -> None:
    channel = grpc.aio.insecure_channel(upstream)
    forward = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)

    async def call(request: bytes, context: Any) -> bytes:
        reply: bytes = await forward(request)
        return reply

    await serve(listen, call)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._echo", description=__doc__)
    parser.add_argument("role", choices=["worker", "relay"])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", default="")
    parser.add_argument("--response-bytes", type=int, default=1000)
    args = parser.parse_args(argv)
    if args.role == "worker":
        asyncio.run(run_worker(args.listen, args.response_bytes))
    else:
        asyncio.run(run_relay(args.listen, args.upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
