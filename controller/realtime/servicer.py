"""The gRPC edges of realtime sessions: `RealtimeServicer` (clients) and `worker_session` (the
worker's WorkerSession stream, served by the WorkerGateway). Both only convert: protobuf <->
the plain messages of `omnirt._internal.protocol.realtime`, which the manager and `relay` work on.

A client's call: SessionOpen first, SessionReady back, then the client's input and the worker's
output relayed at once in both directions until SessionClosed (OK), or a status: the worker's
error (its code, message and field), INVALID_ARGUMENT for a bad message, UNAVAILABLE when the
worker is lost. The client half-closing its side is EndInput (the worker finishes what it
holds); cancelling the call ends the session and frees its slot at once. No input for the
session's idle timeout ends it (SessionClosed, reason `idle_timeout`), as does the controller's
maximum duration (`max_duration`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from omnirt._internal.protocol import realtime as wire
from omnirt._internal.protocol.messages import SessionSettings
from omnirt._internal.protocol.v1 import gateway_pb2 as gw
from omnirt.controller.edges.auth import caller
from omnirt.controller.observability import tracing
from omnirt.controller.realtime.manager import STOP_GRACE_S, SessionManager
from omnirt.controller.realtime.relay import relay
from omnirt.errors import InvalidRequest
from omnirt.v1 import realtime_pb2 as rt
from omnirt.v1 import realtime_pb2_grpc


class RealtimeServicer(realtime_pb2_grpc.RealtimeServiceServicer):
    """RealtimeService.Session over the SessionManager."""

    def __init__(self, manager: SessionManager) -> None:
        self.manager = manager

    async def Session(
        self,
        request_iterator: AsyncIterator[rt.SessionRequest],
        context: grpc.aio.ServicerContext[rt.SessionRequest, rt.SessionResponse],
    ) -> AsyncIterator[rt.SessionResponse]:
        first = await anext(aiter(request_iterator), None)
        opened = wire.request_from_proto(first) if first is not None else None
        if not isinstance(opened, SessionSettings):
            raise InvalidRequest("open: the first message of a session must be SessionOpen", field="open")
        with tracing.remote_parent(tracing.metadata_context(context)):  # the caller's trace
            session, ready = await self.manager.open(opened, tenant=caller().tenant)
        yield wire.response_to_proto(ready)
        inputs = _requests(request_iterator)
        async for response in relay(self.manager, session, opened, inputs, context.cancelled):
            yield wire.response_to_proto(response)


async def _requests(
    messages: AsyncIterator[rt.SessionRequest],
) -> AsyncIterator[wire.SessionRequest | None]:
    """The client's messages converted (None: an empty one, which `check_input` refuses)."""
    async for message in messages:
        yield wire.request_from_proto(message)


async def worker_session(
    manager: SessionManager,
    request_iterator: AsyncIterator[gw.WorkerSessionRequest],
    context: grpc.aio.ServicerContext[Any, Any],
    admit: Any,
) -> AsyncIterator[gw.WorkerSessionResponse]:
    """The worker's side: attach, then its messages to the client and the client's input to it."""
    first = await anext(aiter(request_iterator), None)
    attach = wire.from_worker(first) if first is not None else None
    if not isinstance(attach, wire.SessionAttach):
        raise InvalidRequest("attach: the first message must be SessionAttach", field="attach")
    if admit is not None:
        admit(context, attach.worker_id)
    session = manager.attach(attach)

    async def read() -> None:
        try:
            async for request in request_iterator:
                message = wire.from_worker(request)
                if isinstance(message, wire.SessionReady | wire.OutputChunk | wire.SessionProgress):
                    await session.from_worker.put(message)
                elif isinstance(message, wire.SessionClosed | wire.SessionFailed):
                    session.from_worker.finish(message)
                    return
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            manager.worker_stream_ended(session)

    reader = asyncio.create_task(read())
    try:
        while (message := await session.to_worker.get()) is not None:
            yield wire.to_worker(message)
        # The session is over on this side: let the worker's last messages in, briefly.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await asyncio.shield(reader)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        manager.worker_stream_ended(session)
