"""One server interceptor maps domain errors to gRPC status codes, for every service."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from omnirt.errors import OmniRTError

log = logging.getLogger("omnirt.controller")


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, OmniRTError):
        await context.abort(exc.code, exc.message, trailing_metadata=exc.trailing_metadata())
    log.exception("unexpected error in a handler", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}")


def _wrap_unary(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return handler


def _wrap_stream(fn: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in fn(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return handler


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Turns OmniRTError into its status code, message and trailing metadata."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream),  # type: ignore[arg-type]
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler
