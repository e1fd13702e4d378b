"""`relay`: one open session's input to its worker and its output back, for either client edge.

The gRPC servicer (`servicer.py`) and the WebSocket route (`websocket.py`) each turn their
client's messages into the plain messages of `omnirt._internal.protocol.realtime`, call `relay`
and turn what it yields back into theirs. Until SessionClosed: the client's input is checked
(`check_input`) and relayed at once, the worker's output is passed on as it comes. No input for
the session's idle timeout ends it (SessionClosed, reason `idle_timeout`), as does the
controller's maximum duration (`max_duration`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from omnirt._internal.protocol.messages import SessionSettings
from omnirt._internal.protocol.realtime import (
    EndInput,
    OutputChunk,
    SessionClosed,
    SessionFailed,
    SessionProgress,
    SessionReport,
    SessionRequest,
    SessionResponse,
)
from omnirt.controller.realtime.manager import (
    DEFAULT_IDLE_TIMEOUT_MS,
    STOP_GRACE_S,
    Session,
    SessionManager,
    check_input,
    error_of,
)
from omnirt.errors import InvalidRequest

HALF_CLOSE_GRACE_S = 0.2


async def relay(
    manager: SessionManager,
    session: Session,
    opened: SessionSettings,
    inputs: AsyncIterator[SessionRequest | None],
    gone: Callable[[], bool] = lambda: False,
) -> AsyncIterator[SessionResponse]:
    """The open session's output, while its input is relayed from `inputs` (None: an empty message).

    Raises the worker's error (an OmniRTError) or InvalidRequest for a bad input message. `gone`
    says whether the client's call is gone when its input ends without EndInput.
    """
    idle_s = (opened.idle_timeout_ms or DEFAULT_IDLE_TIMEOUT_MS) / 1000.0
    state = {"last_input": time.monotonic(), "input_done": False}
    failure: list[BaseException] = []

    async def pump() -> None:
        try:
            async for request in inputs:
                message = check_input(request)
                state["last_input"] = time.monotonic()
                if not await manager.send(session, message):
                    return
                if isinstance(message, EndInput):
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
            await manager.send(session, EndInput())
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
            if isinstance(message, OutputChunk | SessionProgress):
                yield message
            elif isinstance(message, SessionClosed):
                if failure:
                    raise failure[0]
                closed = True
                if session.stop_reason and session.stop_reason != "invalid_input":
                    message = replace(message, reason=session.stop_reason)
                yield message
                return
            elif isinstance(message, SessionFailed):
                if failure:
                    raise failure[0]
                raise error_of(message, "the session failed")
        if failure:
            raise failure[0]
        if session.stop_reason and not closed:
            # The worker did not answer the stop in time: the controller's own close.
            report = SessionReport(
                chunks_out=session.chunks_out,
                duration_ms=(time.monotonic() - session.opened_at) * 1000.0,
                worker_id=session.worker_id,
            )
            yield SessionClosed(reason=session.stop_reason, report=report)
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
