"""Errors at the HTTP edge, mapped once: gRPC status -> HTTP status, in two JSON shapes.

The native routes answer `{"error": {"code": "INVALID_ARGUMENT", "message": ..., "field": ...}}`,
with `"violations": [{"field", "description"}, ...]` when a request broke more than one rule
(`field` is the first); the OpenAI-compatible routes answer OpenAI's `{"error": {"message",
"type", "param", "code"}}` (`param`: the first field).
A RESOURCE_EXHAUSTED answer (a full queue, a tenant's quota or rate) carries `Retry-After` in
whole seconds; an UNAUTHENTICATED one `WWW-Authenticate: Bearer` (RFC 6750). A request aiohttp
cannot parse (an over-long line, a bad method, no Host) gets the native shape too
(`protocol_error`), logged by `ProtocolErrorLog`: one WARNING line per kind a minute at most.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from omnirt.errors import OmniRTError, error_for

# Google's mapping of gRPC codes to HTTP (google.rpc.Code), as grpc-gateway and Envoy use it.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
# What the gateway itself answers for HTTP-level faults (no gRPC status behind them).
GATEWAY_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
}


class HttpError(OmniRTError):
    """A fault of the HTTP request itself (content type, body size, route), with its own status."""

    def __init__(self, status: int, message: str, *, field: str = "") -> None:
        super().__init__(message, field=field)
        self.status = status
        self.code = GATEWAY_CODES.get(status, grpc.StatusCode.INVALID_ARGUMENT)


def bad_request(message: str, field: str = "") -> HttpError:
    return HttpError(400, f"{field}: {message}" if field else message, field=field)


def status_of(error: OmniRTError) -> int:
    if isinstance(error, HttpError):
        return error.status
    return HTTP_STATUS.get(error.code, 500)


def _headers(error: OmniRTError) -> dict[str, str]:
    headers: dict[str, str] = {}
    if error.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    if error.code == grpc.StatusCode.UNAUTHENTICATED:
        headers["WWW-Authenticate"] = 'Bearer realm="omnirt"'
    return headers


def native_body(error: OmniRTError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code.name, "message": error.message}
    if error.field:
        body["field"] = error.field
    if len(error.violations) > 1:
        body["violations"] = [{"field": name, "description": text} for name, text in error.violations]
    if error.subject:
        body["subject"] = error.subject
    if error.retry_after_s is not None:
        body["retry_after_ms"] = int(error.retry_after_s * 1000)
    return {"error": body}


def openai_body(error: OmniRTError) -> dict[str, Any]:
    status = status_of(error)
    if status == 429:
        kind = "rate_limit_error"
    elif status == 401:
        kind = "authentication_error"
    elif status == 403:
        kind = "permission_error"
    elif status >= 500 or status == 499:
        kind = "server_error"
    else:
        kind = "invalid_request_error"
    if error.subject == "model":
        code = "model_not_found"
    elif status == 401:
        code = "invalid_api_key"  # OpenAI's code for a missing or wrong key
    else:
        code = error.code.name.lower()
    return {"error": {"message": error.message, "type": kind, "param": error.field or None, "code": code}}


def error_response(error: OmniRTError, *, openai: bool = False) -> web.Response:
    body = openai_body(error) if openai else native_body(error)
    return web.json_response(body, status=status_of(error), headers=_headers(error))


def from_http_exception(exc: web.HTTPException, request: web.Request) -> OmniRTError:
    """An aiohttp exception (no route, wrong method, body too large) as one of our errors."""
    if exc.status == 404:
        return HttpError(404, f"no route for {request.method} {request.path}")
    if exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
        return HttpError(405, f"{request.method} is not allowed on {request.path} (allowed: {allowed})")
    if exc.status == 413:
        return HttpError(413, f"request body too large ({exc.text or 'over the limit'})")
    return HttpError(exc.status, exc.text or exc.reason)


def job_error(code: str, message: str, field: str = "") -> OmniRTError:
    """The typed error for a failed job's `JobError` code."""
    return error_for(code, message, field=field)


# Of aiohttp's text for a request it could not parse (it quotes up to 100 bytes of the request).
MAX_PROTOCOL_MESSAGE_CHARS = 200
MALFORMED = "malformed HTTP request: "


def protocol_error(exc: HttpProcessingError, status: int) -> HttpError:
    """The error for a request aiohttp's parser refused, with its status (aiohttp's: 400 for every
    kind) and its text on one line, bounded; a missing Host header is named as the field."""
    text = " ".join((exc.message or type(exc).__name__).split())
    if len(text) > MAX_PROTOCOL_MESSAGE_CHARS:
        text = text[: MAX_PROTOCOL_MESSAGE_CHARS - 3] + "..."
    field = "Host" if "'Host' header" in text else ""
    return HttpError(status, MALFORMED + text, field=field)


class ProtocolErrorLog:
    """Malformed requests in the log: a WARNING line, without a traceback, per kind at most once
    every `interval_s`, saying how many of that kind went unlogged since. A fuzz run or a port
    scanner used to write some 200 tracebacks of aiohttp's.

    A kind is the parser's exception class and its text up to the first colon ("BadHttpMessage:
    Too many headers received", "LineTooLong: Got more than 8190 bytes when reading"); past
    MAX_KINDS of them, the class alone, so no request can grow the table.
    """

    MAX_KINDS = 64

    def __init__(
        self, logger: logging.Logger, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}  # kinds are aiohttp's exception classes: a handful
        self._unlogged: dict[str, int] = {}

    def record(self, exc: BaseException, peer: str | None, error: HttpError) -> None:
        kind, now = type(exc).__name__, self.clock()
        detail = f"{kind}: {error.message.removeprefix(MALFORMED).split(':', 1)[0][:60]}"
        if detail in self._last or len(self._last) < self.MAX_KINDS:
            kind = detail
        last = self._last.get(kind)
        if last is not None and now - last < self.interval_s:
            self._unlogged[kind] = self._unlogged.get(kind, 0) + 1
            return
        self._last[kind] = now
        unlogged = self._unlogged.pop(kind, 0)
        more = f" ({unlogged} more of this kind since its last line)" if unlogged else ""
        self.logger.warning("HTTP %d to %s: %s%s", status_of(error), peer, error.message, more)
