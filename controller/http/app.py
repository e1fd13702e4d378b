"""`HttpGateway`: the aiohttp server in the controller's event loop, over the same servicers.

Routes: the transcoded public API (`transcode.ROUTES`), the OpenAI-compatible models, images and
videos routes, `/metrics` (Prometheus) and `/healthz`. One middleware admits each request (its
origin, its key, its body's type and size: `security.py`) and runs the handler as that caller
(`CURRENT`, which the servicers read), maps every error once (native or OpenAI JSON shape by
path), counts requests, and keeps the server serving after bad input. Every response gets the
security headers as it starts. A request aiohttp cannot parse never reaches the middleware: the
server's own connection handler (`GatewayRequestHandler`) answers it in the native JSON shape.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import HttpVersion11, web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import Message

from omnirt._internal.address import is_loopback
from omnirt._internal.original import is_original
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.bounds import echo
from omnirt.controller.edges.auth import ANONYMOUS, CURRENT, NOBODY, Principal, caller
from omnirt.controller.edges.shutdown import Shutdown
from omnirt.controller.http import (
    console,
    openai_audio,
    openai_images,
    openai_models,
    openai_videos,
    openapi,
    original_shape,
)
from omnirt.controller.http.errors import (
    HttpError,
    ProtocolErrorLog,
    bad_request,
    error_response,
    from_http_exception,
    protocol_error,
)
from omnirt.controller.http.security import (
    METRICS_PATH,
    Cors,
    action_of,
    check_body_type,
    check_host,
    check_origin,
    is_open,
    key_headers,
    peer_of,
    rpc_level,
    secure,
)
from omnirt.controller.http.streams import send_download, send_sse, send_websocket
from omnirt.controller.http.transcode import (
    ASYNC_KEY,
    DOWNLOAD,
    ROUTES,
    SHAPE_KEY,
    SSE,
    WEBSOCKET,
    Route,
    artifact_links,
    build_request,
    flag,
    method_of,
    read_json,
    to_json,
)
from omnirt.controller.observability import tracing
from omnirt.controller.observability.metrics import CONTENT_TYPE, EngineMetrics
from omnirt.controller.realtime import websocket as realtime_websocket
from omnirt.errors import ExecutionFailed, OmniRTError, PermissionDenied

if TYPE_CHECKING:
    from omnirt.controller.core.engine_client import EngineClient
    from omnirt.controller.edges.auth import Authenticator

log = logging.getLogger("omnirt.controller.http")
OPENAI_PREFIXES = ("/v1/images", "/v1/videos", "/v1/models", "/v1/audio")
MAX_SEQUENCE = 2**64 - 1  # after_sequence is a uint64
SHUTDOWN_GRACE_S = 2.0
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PROTOCOL_ERRORS = ProtocolErrorLog(log)  # one for the process: its lines are per kind, not per gateway


class GatewayRequestHandler(web.RequestHandler):
    """aiohttp's connection handler, with requests its parser refused (an over-long request line
    or header, an invalid method, no Host on HTTP/1.1, not HTTP at all) answered in the native
    JSON shape, with aiohttp's status (400), and logged by PROTOCOL_ERRORS instead of as an
    ERROR with a traceback each. These never reach the application, its middleware or its
    response hooks: the security headers are set here."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError) or not 400 <= status < 500:
            return super().handle_error(request, status, exc, message)  # a handler's failure: logged
        error = protocol_error(exc, status)
        PROTOCOL_ERRORS.record(exc, request.remote, error)
        if request.writer.output_size > 0:  # as aiohttp: the response has begun, close instead
            raise ConnectionError("a response was under way; cannot send an error")
        response = error_response(error)
        secure(response.headers, request.path, tls=request.secure)
        response.force_close()
        return response


class GatewayServer(web.Server):
    """aiohttp's server, making `GatewayRequestHandler`s for its connections."""

    def __call__(self) -> web.RequestHandler:
        return GatewayRequestHandler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """`web.AppRunner` serving the application with a `GatewayServer`; every argument the
    runner gives aiohttp's server (the application's handler, the request factory, the
    handler options) is passed on as it made them."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts the application, as AppRunner does
        return GatewayServer(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )


class CallContext:
    """What the servicers read from a gRPC context, for calls that come over HTTP."""

    def __init__(self, request: web.Request) -> None:
        self.request = request

    def time_remaining(self) -> float | None:
        return None  # HTTP has no call deadline; requests carry timeout_ms / deadline_ms

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((k.lower(), v) for k, v in self.request.headers.items())

    def peer(self) -> str:
        return peer_of(self.request)


def is_openai(path: str) -> bool:
    return path.startswith(OPENAI_PREFIXES)


class HttpGateway:
    """Serves HTTP/JSON on `address` (HOST:PORT; port 0 picks one) next to the gRPC server."""

    def __init__(
        self,
        engine: EngineClient,
        metrics: EngineMetrics,
        servicers: Mapping[str, Any],
        address: str,
        max_body_bytes: int,
        *,
        auth: Authenticator | None = None,
        ssl_context: ssl.SSLContext | None = None,
        cors_origins: Sequence[str] = (),
        metrics_auth: bool = False,
        artifacts: ArtifactStore | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self.engine = engine
        # The controller's shutdown: new requests refused, streams ended, calls given the grace.
        self.shutdown = shutdown or Shutdown()
        self.metrics = metrics  # /metrics, and the gateway's own request counts
        self.artifacts = artifacts  # --artifact-store: the OpenAI routes read objects from it
        self.auth = auth  # None: auth is off (every caller is the anonymous admin)
        self.ssl_context = ssl_context
        self.cors_origins = tuple(cors_origins)
        self.metrics_auth = metrics_auth
        self.cors = Cors(self.cors_origins)
        self._levels: dict[str, str] = {}  # rpc -> what it needs ('admin', 'user', '')
        self.servicers = servicers  # full service name -> servicer
        host, _, port = address.rpartition(":")
        self.host, self.requested_port = host or "127.0.0.1", int(port)
        self.port = 0
        # A loopback gateway without keys answers only to IP addresses and localhost (DNS
        # rebinding); with keys a page cannot call it anyway, and on a network names are normal.
        self._check_host = (auth is None or not auth.enabled) and is_loopback(f"{self.host}:0")
        self.app = web.Application(client_max_size=max_body_bytes, middlewares=[self._middleware])
        for route in ROUTES:
            self.app.router.add_route(
                route.method, route.path, self._handler(route), expect_handler=self.expect_continue
            )
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        openai_models.register(self.app, self)
        openai_images.register(self.app, self)
        openai_videos.register(self.app, self)
        openai_audio.register(self.app, self)
        original_shape.register(self.app, self)  # GET /v1/jobs/{job_id}/trace
        realtime_websocket.register(self.app, self.servicers, self.shutdown)  # WS /v1/avatar/realtime
        console.register(self.app)  # GET / and /console/{name}
        openapi.register(self.app)  # GET /openapi.json, from the routes above
        self.app.on_response_prepare.append(self._on_prepare)
        self._runner: GatewayRunner | None = None

    # ---- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        # handler_cancellation: a client that goes away cancels its handler (and a sync
        # Generate's job), as a cancelled gRPC call does.
        # Open event streams get a short grace at shutdown; the gRPC server has its own.
        self._runner = GatewayRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.requested_port,
            reuse_address=True,
            ssl_context=self.ssl_context,
        )
        await site.start()
        addresses = self._runner.addresses  # the real port when asked for :0
        self.port = int(addresses[0][1]) if addresses else self.requested_port
        log.info("HTTP gateway listening on %s", self.address)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    # ---- calls into the servicers ---------------------------------------------------------

    def _rpc(self, rpc: str, request: web.Request) -> Callable[..., Any]:
        """The servicer's method; every route reaches a servicer here, so the admin check is here."""
        self._require(rpc, request, audit=True)
        method = method_of(rpc)
        servicer = self.servicers[method.containing_service.full_name]
        return getattr(servicer, method.name)

    async def call(self, rpc: str, msg: Message, request: web.Request) -> Any:
        """Run a unary RPC in-process, as the request's caller, with its trace context."""
        fn = self._rpc(rpc, request)
        with tracing.remote_parent(request.headers):
            return await self.shutdown.call(fn(msg, CallContext(request)))

    def stream(self, rpc: str, msg: Message, request: web.Request) -> AsyncGenerator[Any, None]:
        fn = self._rpc(rpc, request)
        return self.shutdown.stream(fn(msg, CallContext(request)))

    def request_type(self, rpc: str) -> Descriptor:
        return method_of(rpc).input_type

    # ---- handlers -------------------------------------------------------------------------

    def _handler(self, route: Route) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            for rpc in filter(None, (route.rpc, route.async_rpc)):
                self._require(rpc, request, audit=False)  # a user's 403 before its body is read
            shape = original_shape.wanted_shape(request) if route.shaped else ""
            body = await read_json(request) if route.body else None
            if route.async_rpc and body is not None and is_original(body):
                return await original_shape.generate(self, request, body, shape)
            rpc, binding = route.rpc, route.body
            if route.async_rpc:
                wanted = (
                    body.pop(ASYNC_KEY) if body and ASYNC_KEY in body else request.query.get(ASYNC_KEY, "")
                )
                if flag(wanted):
                    rpc, binding = route.async_rpc, route.async_body
            # Any: the message's class is the route's RPC's, known at run time only.
            skip = (SHAPE_KEY,) if route.shaped else ()
            descriptor = self.request_type(rpc)
            msg: Any = build_request(binding, descriptor, request.match_info, request.query, body, skip)
            if route.kind == SSE:
                last = request.headers.get("Last-Event-ID", "")
                if last and "after_sequence" not in request.query:
                    msg.after_sequence = last_event_id(last)
                if route.shaped and await original_shape.streams_original(self, request, shape):
                    return await send_sse(request, self.stream(rpc, msg, request), original_shape.sse_event)
                return await send_sse(request, self.stream(rpc, msg, request))
            if route.kind == WEBSOCKET:
                if route.shaped and await original_shape.streams_original(self, request, shape):
                    commands = original_shape.ws_commands(self, request)
                    stream = self.stream(rpc, msg, request)
                    return await send_websocket(
                        request, stream, commands, frame=original_shape.ws_frame, key="action"
                    )
                return await send_websocket(
                    request, self.stream(rpc, msg, request), self._ws_commands(request)
                )
            if route.kind == DOWNLOAD:
                return await send_download(request, self.stream(rpc, msg, request))
            response = await self.call(rpc, msg, request)
            if route.shaped and (shaped := original_shape.answer(request, rpc, response, shape)):
                return shaped
            data = artifact_links(to_json(response), str(request.url.origin()))
            if rpc.endswith(".Submit"):
                location = f"/v1/jobs/{data['job']['id']}"
                return web.json_response(data, status=202, headers={"Location": location})
            return web.json_response(data, status=route.status)

        return handle

    def _ws_commands(
        self, request: web.Request
    ) -> dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]:
        job_id = request.match_info["job_id"]

        async def cancel(_: dict[str, Any]) -> dict[str, Any]:
            msg = build_request(
                "", self.request_type("GenerationService.CancelJob"), {"job_id": job_id}, {}, None
            )
            return {"cancel": to_json(await self.call("GenerationService.CancelJob", msg, request))}

        async def ping(_: dict[str, Any]) -> dict[str, Any]:
            return {"pong": {}}

        return {"cancel": cancel, "ping": ping}

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every response, streams, WebSocket handshakes and errors included, as it starts."""
        secure(response.headers, request.path, tls=self.ssl_context is not None)
        self.cors.mark(request, response.headers)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.shutdown.closing.is_set():
            return web.json_response({"status": "NOT_SERVING", "reason": "shutting down"}, status=503)
        if not self.engine.ready():
            return web.json_response(
                {"status": "NOT_SERVING", "reason": "the job store is unreachable"}, status=503
            )
        return web.json_response({"status": "SERVING", "workers": len(await self.engine.list_workers())})

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        status = 499  # unless a response is made: the client went away (the handler was cancelled)
        try:
            response = await self._respond(request, handler)
            status = response.status
            return response
        finally:
            self._count(request, status, started)

    async def _respond(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The handler's response, or the error it raised as JSON (native or OpenAI shape)."""
        try:
            if self.cors.is_preflight(request):
                return self.cors.preflight(request)  # a browser's, before the request: no key yet
            principal = self._admit(request)
            token = CURRENT.set(principal)  # the servicers' caller() for this request
            try:
                return await handler(request)
            finally:
                CURRENT.reset(token)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            error: OmniRTError = from_http_exception(exc, request)
        except OmniRTError as exc:
            error = exc
        except Exception:
            # The last resort: every bad input has its own 4xx above (tests/integration/
            # test_http_bad_input.py checks none reaches this); what does is a bug, in the log.
            log.exception("HTTP handler failed: %s %s", request.method, request.path)
            error = ExecutionFailed("internal error; the controller's log has the details")
        response = error_response(error, openai=is_openai(request.path))
        if response.status == 413:
            response.force_close()  # the rest of the body is not read
        return response

    # ---- who may call ---------------------------------------------------------------------

    def _admit(self, request: web.Request) -> Principal:
        """The request's caller, after the checks every route shares (in this order):
        a foreign Origin (403), the key (401; 403 for /metrics with a user key under
        --metrics-auth), the body's type (415) and declared size (413). Nothing of the body
        has been read, and no job made, when one of them refuses."""
        check_origin(request, self.cors)
        if self._check_host:
            check_host(request)
        principal = self._authenticate(request)
        check_body_type(request)
        if (too_big := too_large(request)) is not None:
            raise too_big
        return principal

    def _authenticate(self, request: web.Request) -> Principal:
        if is_open(request, self.metrics_auth):
            return NOBODY  # a probe: the handler reads no one's jobs (caller() would refuse)
        if self.auth is None:
            return ANONYMOUS
        peer, action = peer_of(request), action_of(request)
        principal = self.auth.authenticate(key_headers(request), peer, action)
        if request.path == METRICS_PATH:
            self.auth.require_admin(principal, peer, action)
        return principal

    def _require(self, rpc: str, request: web.Request, *, audit: bool) -> None:
        """PermissionDenied (audited) unless the caller may call `rpc`: ClusterService RPCs,
        and any service `auth.needs` says is for admins, need an admin key."""
        level = self._levels.get(rpc)
        if level is None:
            level = self._levels[rpc] = rpc_level(rpc)
        if level != "admin":
            return
        principal = caller()
        name = rpc.rpartition(".")[2]
        if not principal.is_admin:
            if self.auth is not None:
                self.auth.require_admin(principal, peer_of(request), name)  # audited; raises
            raise PermissionDenied(f"{name} needs an admin key")
        if audit and self.auth is not None and self.auth.enabled:
            self.auth.audit.record(
                "admin",
                "allowed",
                tenant=principal.tenant,
                peer=peer_of(request),
                action=name,
                key=principal.key_name,
                route=action_of(request),
            )

    async def expect_continue(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: a refused request (no key, wrong type, a declared body over the
        limit) is answered now, not with a go-ahead.

        aiohttp answers the expectation before any middleware; its own handler would send
        `100 Continue` and the client the whole body, to get the 413 after it.
        """
        try:
            self._admit(request)  # a refusal now, not a go-ahead for a body it will not read
        except OmniRTError as error:
            response = error_response(error, openai=is_openai(request.path))
            self._count(request, response.status, time.monotonic())
            response.force_close()
            return response
        if request.version == HttpVersion11 and request.headers.get("Expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # as aiohttp's handler does: the response has not started
        return None

    def _count(self, request: web.Request, status: int, started: float) -> None:
        resource = request.match_info.route.resource if request.match_info.route else None
        route = resource.canonical if resource is not None else "unmatched"
        metrics = self.metrics
        metrics.http_requests.labels(route, request.method, str(status)).inc()
        metrics.http_latency.labels(route, request.method).observe(time.monotonic() - started)


def too_large(request: web.Request) -> HttpError | None:
    """413 for a declared `Content-Length` over the limit, before any of the body is read.

    aiohttp checks `client_max_size` only while reading: a client that declares a huge body and
    sends a few bytes would hold the handler until the connection times out.
    """
    declared, limit = request.content_length, request.client_max_size
    if declared is None or declared <= limit:
        return None
    return HttpError(413, f"request body too large ({declared} bytes declared, the limit is {limit})")


def last_event_id(value: str) -> int:
    """An EventSource's `Last-Event-ID`: the sequence number of an event this gateway sent."""
    if not (value.isascii() and value.isdigit()) or len(value) > 20 or int(value) > MAX_SEQUENCE:
        reason = f"must be the id of an event, a sequence number (got {echo(value, 20)})"
        raise bad_request(reason, "Last-Event-ID")
    return int(value)
