"""The HTTP gateway's edge checks: who is calling, from which origin, with which body type.

The gRPC `AuthInterceptor` does not run for HTTP (the gateway calls the servicers in-process),
so the gateway's middleware authenticates here, with the same `Authenticator`, and sets
`CURRENT` for the handler. Which RPCs need an admin key is decided from the RPC's service by
`auth.needs`, the rule gRPC uses, so a route added for a new ClusterService RPC is
admin-only without anyone listing it.

A browser can send two kinds of request without a CORS preflight: a form post
(`application/x-www-form-urlencoded`, `multipart/form-data`, `text/plain`) and a WebSocket
handshake. Bodies are taken only as JSON or multipart, and a request whose `Origin` is neither
this gateway's own nor one of `--cors-origin` is refused, so a page on another site cannot make
a logged-in (or keyless, loopback) gateway create, cancel or watch jobs.
"""

from __future__ import annotations

import base64
import ipaddress
from urllib.parse import urlsplit

from aiohttp import web
from multidict import CIMultiDict

from omnirt.controller.edges.auth import needs
from omnirt.controller.http.console import is_console
from omnirt.controller.http.errors import HttpError
from omnirt.controller.http.transcode import method_of
from omnirt.errors import PermissionDenied

# The subprotocols of a browser's WebSocket: the one answered, and the one carrying a key.
WS_PROTOCOL = "omnirt.v1"
WS_KEY_PREFIX = "omnirt.bearer."
HEALTH_PATH = "/healthz"
METRICS_PATH = "/metrics"
OPENAPI_PATH = "/openapi.json"
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
BODY_TYPES = ("application/json", "multipart/form-data")
# What a browser page on an allowed origin may send and read (the SDKs send no other header
# that matters here; traceparent carries a trace across).
ALLOW_HEADERS = "authorization, content-type, last-event-id, traceparent, tracestate, x-omnirt-shape"
EXPOSE_HEADERS = "location, retry-after, etag, x-omnirt-sha256, openai-poll-after-ms"
PREFLIGHT_MAX_AGE_S = "600"
HSTS = "max-age=31536000"
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Every answer is JSON, an event stream or an artifact's bytes: no page, no script, no frame.
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
}


def rpc_level(rpc: str) -> str:
    """'admin', 'user' or '' for `Service.Method`, by its service, as the gRPC edge decides."""
    method = method_of(rpc)
    return needs(f"/{method.containing_service.full_name}/{method.name}")


def peer_of(request: web.Request) -> str:
    """The client's address as gRPC writes a peer (`ipv4:127.0.0.1:5555`), for the audit log."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = str(peer[0]), peer[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return str(request.remote or "unknown")


def action_of(request: web.Request) -> str:
    """`GET /v1/jobs/{job_id}`: the route, not the path (bounded, and no ids in the audit log)."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return f"{request.method} {resource.canonical if resource is not None else request.path}"


def is_open(request: web.Request, metrics_auth: bool) -> bool:
    """What needs no key: `/healthz` always, `/metrics` unless `--metrics-auth`, and what holds
    no data: the console's static files and `/openapi.json` (the same for every caller)."""
    path = request.path
    if path in (HEALTH_PATH, OPENAPI_PATH) or is_console(path):
        return True
    return path == METRICS_PATH and not metrics_auth


def key_headers(request: web.Request) -> list[tuple[str, str]]:
    """The request's headers, with the key of a browser's WebSocket handshake as `authorization`.

    A browser cannot set headers on a WebSocket; it can offer subprotocols. A handshake that
    offers `omnirt.v1` and `omnirt.bearer.BASE64URL(KEY)` (no padding) carries its key in the
    second; the server answers with `omnirt.v1` alone, never echoing the key. An `Authorization`
    header, where a client can send one, wins.
    """
    headers = list(request.headers.items())
    if "Authorization" in request.headers or request.headers.get("Upgrade", "").lower() != "websocket":
        return headers
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    for protocol in (p.strip() for p in offered.split(",")):
        if protocol.startswith(WS_KEY_PREFIX):
            encoded = protocol[len(WS_KEY_PREFIX) :]
            try:
                key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
            except ValueError:  # binascii.Error and UnicodeDecodeError: no key, so a 401
                return headers
            return [*headers, ("authorization", f"Bearer {key}")]
    return headers


def check_body_type(request: web.Request) -> None:
    """415 for a POST/PUT/PATCH whose declared type is not JSON or multipart, before any body is read.

    An empty form post still declares its type: a cross-site `<form enctype="text/plain">` with
    no fields must not drain a worker. A bodiless POST with no Content-Type (`curl -X POST`) is fine.
    """
    if request.method not in BODY_METHODS:
        return
    declared = "Content-Type" in request.headers
    if not declared and not request.body_exists:
        return
    if request.content_type in BODY_TYPES:
        return
    got = request.headers.get("Content-Type", "") or "none"
    raise HttpError(415, f"expected Content-Type application/json or multipart/form-data, got {got[:100]}")


class Cors:
    """`--cors-origin` origins (or `*`): preflights answered and responses marked for them alone."""

    def __init__(self, origins: tuple[str, ...]) -> None:
        self.any = "*" in origins
        self.origins = frozenset(o.rstrip("/") for o in origins if o != "*")

    @property
    def enabled(self) -> bool:
        return self.any or bool(self.origins)

    def allowed(self, origin: str) -> bool:
        return self.any or origin in self.origins

    def allow_origin(self, origin: str) -> str:
        # `*` answers `*`: no credentials (cookies) are ever allowed, keys travel in a header.
        return origin if origin in self.origins else "*"

    def is_preflight(self, request: web.Request) -> bool:
        return (
            request.method == "OPTIONS"
            and "Origin" in request.headers
            and "Access-Control-Request-Method" in request.headers
            and self.allowed(request.headers["Origin"])
        )

    def preflight(self, request: web.Request) -> web.Response:
        origin = request.headers["Origin"]
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": self.allow_origin(origin),
                "Access-Control-Allow-Methods": "GET, POST, DELETE",
                "Access-Control-Allow-Headers": ALLOW_HEADERS,
                "Access-Control-Max-Age": PREFLIGHT_MAX_AGE_S,
                "Vary": "Origin",
            },
        )

    def mark(self, request: web.Request, headers: CIMultiDict[str]) -> None:
        """Allow an allowed origin to read this response."""
        if not self.enabled:
            return
        headers.add("Vary", "Origin")
        origin = request.headers.get("Origin", "")
        if origin and self.allowed(origin) and "Access-Control-Allow-Origin" not in headers:
            headers["Access-Control-Allow-Origin"] = self.allow_origin(origin)
            headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS


def check_origin(request: web.Request, cors: Cors) -> None:
    """403 for a request a page on another site made (its `Origin` is not ours, nor allowed).

    Clients other than browsers send no `Origin`. Our own origin is compared by host and port
    only: behind a TLS-terminating proxy the scheme the browser used is not the one seen here.
    """
    origin = request.headers.get("Origin")
    if origin is None or cors.allowed(origin):
        return
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:
        netloc = ""
    if netloc and netloc.lower() == (request.host or "").lower():
        return
    raise PermissionDenied(
        f"requests from the origin {origin[:100]!r} are not allowed (see --cors-origin)",
        field="Origin",
    )


def check_host(request: web.Request) -> None:
    """403 unless the `Host` is an IP address or `localhost`: for a gateway on loopback without
    API keys, where a page on another site could otherwise reach it through a name it points at
    127.0.0.1 (DNS rebinding: the browser then sees the gateway as that site's own origin)."""
    host = (request.host or "").lower()
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip("[]")
    if name == "localhost":
        return
    try:
        ipaddress.ip_address(name)
    except ValueError:
        raise PermissionDenied(
            f"Host {host[:100]!r}: without API keys this gateway answers only to localhost or an IP "
            "address (a name could be a DNS rebinding page); use --auth-keys to serve names",
            field="Host",
        ) from None


def secure(headers: CIMultiDict[str], path: str, tls: bool) -> None:
    """The security headers every response carries."""
    for name, value in SECURITY_HEADERS.items():
        headers.setdefault(name, value)
    if path != METRICS_PATH:
        headers["Cache-Control"] = "no-store"  # job data, prompts and images: no cache keeps them
    if tls:
        headers["Strict-Transport-Security"] = HSTS
