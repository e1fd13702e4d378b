"""One server interceptor maps domain errors to gRPC status codes, for every service.

Besides the code and message, an error carries the `omnirt-error-*` trailers the SDK reads and
the standard `google.rpc.Status` details (`grpc-status-details-bin`: ErrorInfo on every error,
BadRequest when a field is at fault, one violation per field, RetryInfo with a retry hint) that
other gRPC clients read.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2, message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from omnirt.controller.core.bounds import MAX_FIELD_CHARS
from omnirt.errors import FIELDS_KEY, InvalidRequest, OmniRTError

log = logging.getLogger("omnirt.controller")

ERROR_DOMAIN = "omnirt.dev"
# Status message and trailers travel as metadata, which clients cap (8 KiB soft, 16 KiB hard
# by default): past that the caller sees RESOURCE_EXHAUSTED "Stream removed", not the error.
# With these bounds all of it stays under 8 KiB (measured: 7 KiB at most, for a message of
# 2- or 4-byte characters, percent-encoded, then again in the details, base64).
MAX_ERROR_MESSAGE_BYTES = 1024
MAX_METADATA_CHARS = MAX_FIELD_CHARS  # what validation lets through for a field: it arrives whole
MAX_DESCRIPTION_CHARS = 256  # of a BadRequest violation: the message again, in short
MAX_INTERNAL_CHARS = 300  # of an unexpected exception's text: enough to recognise it, no dump
# Of the violations after the first (fields and descriptions): the rest are left out, still named
# in the message. With it the details stay under 4 KiB (grpc-status-details-bin; 2.5 KiB before).
MAX_MORE_VIOLATIONS_BYTES = 1024


def bounded(text: str, limit: int) -> str:
    """`text` cut to `limit` UTF-8 bytes (at a character boundary), marked with `...`."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."


def _metadata_value(text: str) -> str:
    # ASCII metadata must be printable ASCII (one newline made the status "Invalid metadata",
    # INTERNAL): anything else goes as Python escapes, as validation writes field paths.
    if not (text.isascii() and text.isprintable()):
        text = ascii(text)[1:-1]
    return bounded(text, MAX_METADATA_CHARS)


def _reason(exc: OmniRTError) -> str:
    """The class name in upper snake case: InvalidRequest -> INVALID_REQUEST."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", type(exc).__name__).upper()


def _pack(detail: message.Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(detail)
    return packed


def _violations(exc: OmniRTError, message_text: str) -> list[error_details_pb2.BadRequest.FieldViolation]:
    """`exc`'s violations, bounded: the first as one error always had it (the message as its
    description), the others while they fit MAX_MORE_VIOLATIONS_BYTES."""
    if not exc.field:
        return []
    first = (exc.field, message_text if len(exc.violations) <= 1 else exc.violations[0][1])
    kept: list[error_details_pb2.BadRequest.FieldViolation] = []
    size = 0
    for field, description in [first, *exc.violations[1:]]:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=_metadata_value(field), description=bounded(description, MAX_DESCRIPTION_CHARS)
        )
        if kept:
            size += len(violation.field) + len(violation.description.encode())
            if size > MAX_MORE_VIOLATIONS_BYTES:
                break
        kept.append(violation)
    return kept


def _fields_trailer(violations: list[error_details_pb2.BadRequest.FieldViolation]) -> tuple[str, str] | None:
    """The `omnirt-error-fields` trailer: as many of the fields (in order) as fit a metadata value."""
    fields = [v.field for v in violations]
    while len(fields) > 1:
        text = json.dumps(fields)
        if len(text) <= MAX_METADATA_CHARS:
            return FIELDS_KEY, text
        fields.pop()
    return None


def status_trailers(exc: OmniRTError, message_text: str) -> tuple[tuple[str, str | bytes], ...]:
    """The SDK's trailers and the google.rpc.Status of `exc`, all bounded."""
    violations = _violations(exc, message_text)
    trailers = tuple((key, _metadata_value(value)) for key, value in exc.trailing_metadata())
    fields = _fields_trailer(violations)  # built here: cut to whole fields, it stays JSON
    if fields is not None:
        trailers = (*trailers, fields)
    info = error_details_pb2.ErrorInfo(reason=_reason(exc), domain=ERROR_DOMAIN)
    for key, value in (("field", exc.field), ("subject", exc.subject)):
        if value:
            info.metadata[key] = _metadata_value(value)
    details = [_pack(info)]
    if violations:
        details.append(_pack(error_details_pb2.BadRequest(field_violations=violations)))
    if exc.retry_after_s is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(exc.retry_after_s * 1000))
        details.append(_pack(error_details_pb2.RetryInfo(retry_delay=delay)))
    status = status_pb2.Status(code=exc.code.value[0], message=message_text, details=details)
    return (*trailers, *rpc_status.to_status(status).trailing_metadata)


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, OmniRTError):
        text = bounded(exc.message, MAX_ERROR_MESSAGE_BYTES)
        await context.abort(exc.code, text, trailing_metadata=status_trailers(exc, text))
    log.exception("unexpected error in a handler", exc_info=exc)
    text = bounded(str(exc), MAX_INTERNAL_CHARS)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {text}")


class _Undecodable:
    """What a request that is not a valid message deserializes to.

    grpc would answer UNKNOWN ("Wire format was corrupt") before any handler runs; the wrapped
    handler answers INVALID_ARGUMENT instead."""

    def __init__(self, type_name: str) -> None:
        self.error = InvalidRequest(f"the request is not a valid {type_name} message")


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None
    message_type = getattr(deserializer, "__self__", None)  # Message.FromString is bound to its class
    type_name = getattr(getattr(message_type, "DESCRIPTOR", None), "full_name", "request")

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception:  # DecodeError, or whatever another deserializer raises
            return _Undecodable(type_name)

    return deserialize


async def _checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Undecodable):
            await _abort(context, request.error)
        yield request


def _wrap(fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
    """`fn` with errors mapped; a stream of responses may be an async generator or a coroutine
    that writes with `context.write` (grpc's health Watch), and the wrapper is the same kind."""

    async def request_of(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request_streaming:
            return _checked(request, context)
        if isinstance(request, _Undecodable):
            await _abort(context, request.error)
        return request

    if inspect.isasyncgenfunction(fn):

        async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in fn(await request_of(request, context), context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:
                await _abort(context, exc)

        return generator

    async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(await request_of(request, context), context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return coroutine


# (request streaming, response streaming) -> the handler's attribute and its factory
HANDLER_FACTORIES = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


class WrappingInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that wraps the behaviour of the handlers it chooses, each method's once.

    Per method, not per call: wrapping cost 2.8 us of every call, the cached lookup 0.2 us. Only
    registered methods get here, so the cache stays small; the handler is compared in case a
    later interceptor changes what it answers. Subclasses say what to wrap (`wrap`) and may
    replace the request deserializer (`deserializer`)."""

    def __init__(self) -> None:
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    def wrap(self, method: str, fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any] | None:
        """The behaviour to serve `method` with instead of `fn`, or None to leave it as it is."""
        raise NotImplementedError

    def deserializer(self, handler: grpc.RpcMethodHandler) -> Callable[[bytes], Any] | None:
        return handler.request_deserializer

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        attr, factory = HANDLER_FACTORIES[(handler.request_streaming, handler.response_streaming)]
        fn = getattr(handler, attr)
        behaviour = self.wrap(method, fn, handler.request_streaming) if fn is not None else None
        wrapped = handler
        if behaviour is not None:
            wrapped = factory(
                behaviour,
                request_deserializer=self.deserializer(handler),
                response_serializer=handler.response_serializer,
            )
        self._wrapped[method] = (handler, wrapped)
        return wrapped


class ErrorInterceptor(WrappingInterceptor):
    """Turns OmniRTError into its status code, message and trailing metadata, and a request
    that is not a valid message into INVALID_ARGUMENT."""

    def wrap(self, method: str, fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
        return _wrap(fn, request_streaming)

    def deserializer(self, handler: grpc.RpcMethodHandler) -> Callable[[bytes], Any] | None:
        return _tolerant(handler.request_deserializer)
