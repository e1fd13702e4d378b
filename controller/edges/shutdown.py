"""The controller's graceful shutdown as its edges see it (docs/operations.md, "Rolling upgrades").

On SIGTERM the controller `close`s: new calls are refused UNAVAILABLE with a RetryInfo (the
SDK sends them again, to another controller behind the same address), open streams (WatchJob,
SSE, WebSocket, realtime sessions) end at once with "controller shutting down, reconnect", and
unary calls in flight (a Generate waiting for its job) may finish. When they are done, or the
grace runs out (`expire`), those still running end the same way, and the workers are told to
reconnect. gRPC health, reflection and the worker stream are not gated: probes must see
NOT_SERVING, and the workers keep running jobs until the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from omnirt.controller.edges.interceptors import WrappingInterceptor
from omnirt.errors import Unavailable

T = TypeVar("T")

RETRY_AFTER_S = 1.0  # what the refusals' RetryInfo asks for
# Methods never gated: probes, reflection and the worker stream (the workers run jobs to the end).
UNGATED = ("/grpc.health.v1.Health/", "/grpc.reflection.", "/omnirt.worker.")
REFUSED = "the controller is shutting down: send the call again (another controller takes it)"
STREAM_ENDED = (
    "controller shutting down, reconnect: the stream ended here (a watch resumes after its last event "
    "on another controller)"
)
CALL_ENDED = (
    "the controller shut down before the call finished: send it again (with an idempotency key it "
    "finds the same job)"
)


class Shutdown:
    """Where a shutdown stands: `closing` from SIGTERM, `expired` at the end of the grace."""

    def __init__(self) -> None:
        self.closing = asyncio.Event()
        self.expired = asyncio.Event()
        self._running: set[asyncio.Task[Any]] = set()  # the tasks of the unary calls in flight
        self._ended: set[asyncio.Task[Any]] = set()  # those `expire` cancelled
        self._idle = asyncio.Event()
        self._idle.set()

    def close(self) -> None:
        self.closing.set()

    def expire(self) -> None:
        """The grace is over: the unary calls still running end (see `call`)."""
        self.closing.set()
        self.expired.set()
        for task in self._running:
            self._ended.add(task)
            task.cancel()

    async def calls_done(self, timeout_s: float) -> bool:
        """Wait for the unary calls in flight to finish, up to `timeout_s`; whether they did."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        return self._idle.is_set()

    def check(self) -> None:
        """Unavailable (with RetryInfo) once closing: a new call is refused."""
        if self.closing.is_set():
            raise Unavailable(REFUSED, retry_after_s=RETRY_AFTER_S)

    async def call(self, work: Awaitable[T]) -> T:
        """Run a unary call's `work` in this task, ended with Unavailable if the grace expires
        first (`expire` cancels the tasks still running; no task of its own per call)."""
        self.check()
        task = asyncio.current_task()
        assert task is not None
        self._running.add(task)
        self._idle.clear()
        try:
            return await work
        except asyncio.CancelledError:
            if task not in self._ended:
                raise  # the caller went away, or the server stopped it: as before
            task.uncancel()
            raise Unavailable(CALL_ENDED, retry_after_s=RETRY_AFTER_S) from None
        finally:
            self._running.discard(task)
            self._ended.discard(task)
            if not self._running:
                self._idle.set()

    async def session(self, work: Awaitable[T]) -> T:
        """Run a long-lived exchange (a WebSocket session), ended with Unavailable as soon as
        the controller starts closing, as a stream is."""
        self.check()
        task = asyncio.ensure_future(work)
        try:
            await _first(task, self.closing)
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise Unavailable(STREAM_ENDED, retry_after_s=RETRY_AFTER_S)
            return task.result()
        finally:
            if not task.done():
                task.cancel()

    async def stream(self, items: AsyncIterator[T]) -> AsyncGenerator[T, None]:
        """`items`, ended with Unavailable as soon as the controller starts closing."""
        self.check()
        iterator = aiter(items)
        step: asyncio.Future[T] | None = None
        try:
            while True:
                step = asyncio.ensure_future(anext(iterator))
                await _first(step, self.closing)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await step
                    raise Unavailable(STREAM_ENDED, retry_after_s=RETRY_AFTER_S)
                try:
                    item = step.result()
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    # Cancelled by something other than our caller (which would be cancelled
                    # itself): a handler that raised CancelledError would leave the client's
                    # call hanging until the server stops, so end it as one to resume.
                    task = asyncio.current_task()
                    if task is not None and task.cancelling():
                        raise
                    raise Unavailable(STREAM_ENDED, retry_after_s=RETRY_AFTER_S) from None
                yield item
        finally:
            if step is not None and not step.done():
                # Our caller was cancelled (the client went away): the stream's own code sees
                # the cancellation where it waits, as it would without this wrapper.
                step.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await step
            elif step is not None and not step.cancelled():
                step.exception()  # the stream ended as the client went: read, not logged as lost
            close = getattr(iterator, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()


async def _first(task: asyncio.Future[Any], event: asyncio.Event) -> None:
    """Wait until `task` is done or `event` is set, whichever comes first."""
    if task.done() or event.is_set():
        if not task.done():
            await asyncio.sleep(0)  # let a task that is ready finish first
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


class ShutdownInterceptor(WrappingInterceptor):
    """Gates every public gRPC method with `shutdown` (after the ErrorInterceptor, which turns
    the Unavailable into UNAVAILABLE with the RetryInfo detail)."""

    def __init__(self, shutdown: Shutdown) -> None:
        super().__init__()
        self.shutdown = shutdown

    def wrap(self, method: str, fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any] | None:
        if method.startswith(UNGATED):
            return None
        shutdown = self.shutdown
        if inspect.isasyncgenfunction(fn):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async for item in shutdown.stream(fn(request, context)):
                    yield item

            return generator

        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await shutdown.call(fn(request, context))

        return coroutine
