"""`GET /openapi.json`: an OpenAPI 3.1 document of every route the gateway serves.

The document is made from the aiohttp router itself, once, at the first request (the router is
frozen by then), so a route added to the gateway is in it without anyone listing it. A route of
`transcode.ROUTES` is described from its RPC's protobuf descriptors (`proto_schema.py`: the
proto3 JSON mapping the gateway speaks); the others (OpenAI-compatible routes, streams, probes,
the console) from `route_docs.py`. A route in neither gets a bare entry saying so, and a test
keeps that from happening.
"""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from omnirt import __version__
from omnirt.controller.http import route_docs
from omnirt.controller.http.proto_schema import Schemas
from omnirt.controller.http.security import OPENAPI_PATH, rpc_level
from omnirt.controller.http.transcode import (
    ASYNC_KEY,
    DOWNLOAD,
    ROUTES,
    SHAPE_KEY,
    SSE,
    WEBSOCKET,
    Route,
    method_of,
)

ERROR_REF = {"$ref": "#/components/schemas/Error"}
ERROR = {
    "type": "object",
    "description": "The native error shape; OpenAI-compatible routes answer OpenAI's.",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string", "description": "the gRPC status name, e.g. INVALID_ARGUMENT"},
                "message": {"type": "string"},
                "field": {"type": "string", "description": "the request field at fault, if one is"},
            },
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}
ERRORS = {
    "400": "invalid request (the field is named)",
    "401": "no key, or not a valid one",
    "403": "not allowed to this key (an admin route) or this origin",
    "404": "not found (another tenant's job is not found too)",
    "429": "queue full, or the tenant's quota or rate (Retry-After)",
}
_PARAM = re.compile(r"\{(\w+)\}")
# What only the original OmniRT's request has (`omnirt._internal.original.is_original`).
ORIGINAL_MARKERS = {
    "anyOf": [
        {"required": ["config"]},
        {"required": ["backend"]},
        {"required": ["async_run"]},
        {"required": ["inputs"], "properties": {"inputs": {"type": "object"}}},
    ]
}
SHAPE_PARAMETERS = [
    {
        "name": SHAPE_KEY,
        "in": "query",
        "schema": {"type": "string", "enum": ["omnirt", "original"]},
        "description": "answer in this shape (default: the job's own: the original OmniRT's for a job "
        "submitted in its shape)",
    },
    {
        "name": "X-Omnirt-Shape",
        "in": "header",
        "schema": {"type": "string", "enum": ["omnirt", "original"]},
        "description": f"as ?{SHAPE_KEY}= (the query wins)",
    },
]


def _original(ref: dict[str, Any], *names: str) -> dict[str, Any]:
    """`ref`, or one of the original OmniRT's schemas (`route_docs.ORIGINAL_SCHEMAS`)."""
    return {"anyOf": [ref, *({"$ref": f"#/components/schemas/original.{n}"} for n in names)]}


def _error_responses() -> dict[str, Any]:
    content = {"application/json": {"schema": ERROR_REF}}
    return {code: {"description": text, "content": content} for code, text in ERRORS.items()}


def _operation_id(method: str, path: str) -> str:
    words = re.sub(r"[^A-Za-z0-9]+", "_", path.replace("{", "by_").replace("}", "")).strip("_")
    return f"{method.lower()}_{words or 'root'}"


def _transcoded(route: Route, schemas: Schemas) -> dict[str, Any]:
    """An operation from the route's RPC: path, query and body bound as the gateway binds them."""
    method = method_of(route.rpc)
    request = method.input_type
    path_names = _PARAM.findall(route.path)
    op: dict[str, Any] = {
        "summary": f"{route.rpc} ({route.kind})" if route.kind != "unary" else route.rpc,
        "tags": [method.containing_service.name],
        "parameters": [
            {"name": n, "in": "path", "required": True, "schema": schemas.field(request.fields_by_name[n])}
            for n in path_names
        ],
    }
    if not route.body:
        for field in request.fields:
            if field.name not in path_names and field.message_type is None:
                query: dict[str, Any] = {"name": field.name, "in": "query", "schema": schemas.field(field)}
                if field.is_repeated:
                    query.update(style="form", explode=True)
                op["parameters"].append(query)
    else:
        body = schemas.body(request, route.body)
        if route.async_rpc:
            op["parameters"].append(
                {
                    "name": ASYNC_KEY,
                    "in": "query",
                    "schema": {"type": "boolean"},
                    "description": (f"true: run {route.async_rpc} instead (the body may carry it too)"),
                }
            )
        if route.shaped:  # /v1/generate: ours, or the original OmniRT's request
            original_body = {"$ref": "#/components/schemas/original.GenerateRequest"}
            body = {"oneOf": [{"allOf": [body, {"not": ORIGINAL_MARKERS}]}, original_body]}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    if route.shaped:
        op["parameters"] += SHAPE_PARAMETERS
    response = schemas.ref(method.output_type)
    if route.shaped and route.kind not in (SSE, WEBSOCKET):
        response = _original(response, *(("GenerateResult", "Job") if route.body else ("Job",)))
    if route.kind == SSE:
        content = {
            "text/event-stream": {
                "schema": {
                    "type": "string",
                    "description": "event: KIND, data: a WatchJobResponse.event as JSON",
                }
            }
        }
        ok = {"description": "JobEvents as Server-Sent Events (id = sequence)", "content": content}
        resume = {"type": "string", "pattern": "^[0-9]+$", "description": "resume after this event id"}
        op["parameters"].append({"name": "Last-Event-ID", "in": "header", "schema": resume})
        event = method.output_type.fields_by_name["event"].message_type
        assert event is not None  # WatchJobResponse.event is a JobEvent
        # what each event's data is (the original OmniRT's event record for a job in its shape)
        op["x-event-schema"] = _original(schemas.ref(event), "Event")
    elif route.kind == WEBSOCKET:
        op["summary"] += ": upgrade to a WebSocket of {event: JobEvent} frames"
        ok = {"description": "Switching Protocols (WebSocket)"}
    elif route.kind == DOWNLOAD:
        ok = {"description": "the artifact's bytes", "content": {"*/*": {"schema": {}}}}
    else:
        ok = {"description": "OK", "content": {"application/json": {"schema": response}}}
    status = "101" if route.kind == WEBSOCKET else str(route.status)
    op["responses"] = {status: ok, **_error_responses()}
    if route.async_rpc:
        async_out = schemas.ref(method_of(route.async_rpc).output_type)
        op["responses"]["202"] = {
            "description": f"with async: {route.async_rpc}'s answer",
            "content": {"application/json": {"schema": async_out}},
        }
    if rpc_level(route.rpc) == "admin":
        op["description"] = "Needs an admin key."
    return op


def build(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document of `app`'s routes."""
    schemas = Schemas()
    schemas.extra["Error"] = ERROR
    schemas.extra.update(route_docs.ORIGINAL_SCHEMAS)
    transcoded = {(r.method, r.path): r for r in ROUTES}
    paths: dict[str, dict[str, Any]] = {}
    for resource_route in app.router.routes():
        resource = resource_route.resource
        method = resource_route.method
        if resource is None or method == "HEAD":  # HEAD: the GET handler again
            continue
        path = resource.canonical
        route = transcoded.get((method, path))
        if route is not None:
            op = _transcoded(route, schemas)
        else:
            op = route_docs.operation(method, path)
            for name in _PARAM.findall(path):
                parameter = {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                op.setdefault("parameters", []).insert(0, parameter)
            op.setdefault("responses", {"200": {"description": "OK"}})
            if op.get("security") != []:  # routes that need a key can be refused
                op["responses"].update(_error_responses())
        op["operationId"] = _operation_id(method, path)
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "OmniRT HTTP API",
            "version": __version__,
            "description": "The controller's HTTP gateway: the transcoded omnirt.v1 API (proto3 JSON: "
            "int64 as strings, enums by name, bytes as base64), OpenAI-compatible routes, job streams, "
            "the realtime avatar WebSocket and probes. Send the key as `Authorization: Bearer KEY`.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.all().items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def register(app: web.Application) -> None:
    """Add `GET /openapi.json`; register it after every other route."""
    cached: list[bytes] = []

    async def document(request: web.Request) -> web.Response:
        if not cached:
            cached.append(json.dumps(build(request.app), indent=1).encode())
        return web.Response(body=cached[0], content_type="application/json")

    app.router.add_get(OPENAPI_PATH, document)
