"""The gRPC edges of realtime sessions: `RealtimeServicer` (clients) and `worker_session` (the
worker's WorkerSession stream, served by the WorkerGateway).

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
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from omnirt._internal.protocol.v1 import gateway_pb2 as gw
from omnirt.controller.edges.auth import caller
from omnirt.controller.observability import tracing
from omnirt.controller.realtime.manager import (
    DEFAULT_IDLE_TIMEOUT_MS,
    STOP_GRACE_S,
    Session,
    SessionManager,
    check_input,
    error_of,
)
from omnirt.errors import InvalidRequest
from omnirt.v1 import realtime_pb2 as rt
from omnirt.v1 import realtime_pb2_grpc

HALF_CLOSE_GRACE_S = 0.2


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
        if first is None or first.WhichOneof("message") != "open":
            raise InvalidRequest("open: the first message of a session must be SessionOpen", field="open")
        with tracing.remote_parent(tracing.metadata_context(context)):  # the caller's trace
            session, ready = await self.manager.open(first.open, tenant=caller().tenant)
        yield rt.SessionResponse(ready=ready)
        async for response in relay(self.manager, session, first.open, request_iterator, context.cancelled):
            yield response


async def relay(
    manager: SessionManager,
    session: Session,
    opened: rt.SessionOpen,
    inputs: AsyncIterator[rt.SessionRequest],
    gone: Callable[[], bool] = lambda: False,
) -> AsyncIterator[rt.SessionResponse]:
    """The open session's output, while its input is relayed from `inputs` (both edges use it).

    Raises the worker's error (an OmniRTError) or InvalidRequest for a bad input message.
    """
    idle_s = (opened.idle_timeout_ms or DEFAULT_IDLE_TIMEOUT_MS) / 1000.0
    state = {"last_input": time.monotonic(), "input_done": False}
    failure: list[BaseException] = []

    async def pump() -> None:
        try:
            async for message in inputs:
                check_input(message)
                state["last_input"] = time.monotonic()
                if not await manager.send(session, message):
                    return
                if message.WhichOneof("message") == "end":
                    state["input_done"] = True
                    return
            # The client closed its side without EndInput: the same, unless the call itself is
            # gone. grpc.aio ends a cancelled call's input as if half-closed and cancels the
            # response side just after: wait for that before taking it as EndInput (this task
            # is cancelled then, and the session stops as the client is gone).
            await asyncio.sleep(HALF_CLOSE_GRACE_S)
            if gone():
                await manager.stop(session, "client_gone")
                return
            state["input_done"] = True
            await manager.send(session, rt.SessionRequest(end=rt.EndInput()))
        except InvalidRequest as exc:
            failure.append(exc)
            await manager.stop(session, "invalid_input")

    async def watch() -> None:
        while not session.ended:
            await asyncio.sleep(min(1.0, idle_s / 4))
            now = time.monotonic()
            if not state["input_done"] and now - state["last_input"] > idle_s:
                await manager.stop(session, "idle_timeout")
                return
            if manager.max_duration_s and now - session.opened_at > manager.max_duration_s:
                await manager.stop(session, "max_duration")
                return

    tasks = [asyncio.create_task(pump()), asyncio.create_task(watch())]
    closed = False
    try:
        while True:
            try:
                async with asyncio.timeout(STOP_GRACE_S if session.stop_reason else None):
                    message = await manager.receive(session)
            except TimeoutError:
                break
            if message is None:
                break
            kind = message.WhichOneof("message")
            if kind == "chunk":
                yield rt.SessionResponse(chunk=message.chunk)
            elif kind == "progress":
                yield rt.SessionResponse(progress=message.progress)
            elif kind == "closed":
                if failure:
                    raise failure[0]
                closed = True
                done = rt.SessionClosed()
                done.CopyFrom(message.closed)
                if session.stop_reason and session.stop_reason != "invalid_input":
                    done.reason = session.stop_reason
                yield rt.SessionResponse(closed=done)
                return
            elif kind == "error":
                if failure:
                    raise failure[0]
                raise error_of(message, "the session failed")
        if failure:
            raise failure[0]
        if session.stop_reason and not closed:
            # The worker did not answer the stop in time: the controller's own close.
            report = rt.SessionReport(
                chunks_out=session.chunks_out,
                duration_ms=(time.monotonic() - session.opened_at) * 1000.0,
                worker_id=session.worker_id,
            )
            yield rt.SessionResponse(closed=rt.SessionClosed(reason=session.stop_reason, report=report))
            return
        raise error_of(None, f"worker {session.worker_id} lost the session")
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not session.ended:
            await manager.stop(session, "client_gone")


async def worker_session(
    manager: SessionManager,
    request_iterator: AsyncIterator[gw.WorkerSessionRequest],
    context: grpc.aio.ServicerContext[Any, Any],
    admit: Any,
) -> AsyncIterator[gw.WorkerSessionResponse]:
    """The worker's side: attach, then its messages to the client and the client's input to it."""
    first = await anext(aiter(request_iterator), None)
    if first is None or first.WhichOneof("message") != "attach":
        raise InvalidRequest("attach: the first message must be SessionAttach", field="attach")
    if admit is not None:
        admit(context, first.attach.worker_id)
    session = manager.attach(first.attach)

    async def read() -> None:
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("message")
                if kind in ("ready", "chunk", "progress"):
                    await session.from_worker.put(message)
                elif kind in ("closed", "error"):
                    session.from_worker.finish(message)
                    return
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        finally:
            manager.worker_stream_ended(session)

    reader = asyncio.create_task(read())
    try:
        while (message := await session.to_worker.get()) is not None:
            yield message
        # The session is over on this side: let the worker's last messages in, briefly.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_GRACE_S):
                await asyncio.shield(reader)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
        manager.worker_stream_ended(session)
