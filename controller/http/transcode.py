"""The generic JSON <-> proto transcoder: one route table over the public gRPC methods.

Each route names an RPC of `omnirt.v1`; its request and response types come from the
service descriptors and its JSON from `google.protobuf.json_format` (proto field names;
lowerCamelCase is accepted on input; enums by name, or by their short name: `"text2image"`
for `TASK_TEXT2IMAGE`). Path parameters, query parameters and the JSON body fill the request
message like `google.api.http` bindings do (`body="*"`: the body is the message,
`body="request"`: the body is that field); the call goes to the same servicer (and so the same
Engine) the gRPC server uses. Four kinds of route: unary JSON, a server stream as Server-Sent
Events, as a WebSocket, or as a raw download.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

from .errors import HttpError, bad_request

UNARY, SSE, WEBSOCKET, DOWNLOAD = "unary", "sse", "websocket", "download"
ASYNC_KEY = "async"


@dataclass(frozen=True)
class Route:
    """(method, path) -> an RPC, and how its request is bound and its response sent."""

    method: str
    path: str
    rpc: str  # "GenerationService.Generate"
    body: str = ""  # "" (no body), "*" (the whole message) or a field name
    kind: str = UNARY
    status: int = 200
    # `"async": true` in the body (or `?async=true`) calls this RPC instead, with this body binding.
    async_rpc: str = ""
    async_body: str = ""


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/generate",
        "GenerationService.Generate",
        body="*",
        async_rpc="GenerationService.Submit",
        async_body="request",
    ),
    Route("POST", "/v1/jobs", "GenerationService.Submit", body="request", status=202),
    Route("GET", "/v1/jobs", "GenerationService.ListJobs"),
    Route("GET", "/v1/jobs/{job_id}", "GenerationService.GetJob"),
    Route("DELETE", "/v1/jobs/{job_id}", "GenerationService.CancelJob"),
    Route("GET", "/v1/jobs/{job_id}/events", "GenerationService.WatchJob", kind=SSE),
    Route("GET", "/v1/jobs/{job_id}/stream", "GenerationService.WatchJob", kind=WEBSOCKET),
    Route("GET", "/v1/jobs/{job_id}/artifacts/{index}", "GenerationService.DownloadArtifact", kind=DOWNLOAD),
    Route("POST", "/v1/validate", "GenerationService.Validate", body="request"),
    Route("GET", "/v1/models", "ModelService.ListModels"),
    Route("GET", "/v1/models/{model}", "ModelService.DescribeModel"),
    Route("GET", "/v1/workers", "ClusterService.ListWorkers"),
    Route("POST", "/v1/workers/{worker_id}/drain", "ClusterService.DrainWorker"),
)
PACKAGE = "omnirt.v1"
ARTIFACT_URI = "omnirt://jobs/"


def method_of(rpc: str) -> MethodDescriptor:
    """The descriptor of `Service.Method` in the public package."""
    service, name = rpc.split(".")
    pool = descriptor_pool.Default()
    return pool.FindServiceByName(f"{PACKAGE}.{service}").methods_by_name[name]


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def to_json(msg: Message) -> dict[str, Any]:
    """A message as JSON: proto field names, fields without presence always printed."""
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


# ---- JSON -> message ----------------------------------------------------------------------

_NO_FIELD = re.compile(r'has no field named "([^"]+)"')
_AT_PATH = re.compile(r"\bat \"?[A-Za-z0-9_]+\.([A-Za-z0-9_.\[\]]+?)\"?\.?$")
_PARSE_FIELD = re.compile(r"Failed to parse ([A-Za-z0-9_]+) field")


def _parse_error(exc: json_format.ParseError) -> HttpError:
    text = str(exc).split("\n")[0].strip()
    path = _PARSE_FIELD.findall(text)  # nested: "Failed to parse output field: Failed to parse format field"
    match = _NO_FIELD.search(text) or _AT_PATH.search(text)
    field = match.group(1) if match else ".".join(path)
    return HttpError(400, f"{field}: {text}" if field else text, field=field)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _enum_value(field: FieldDescriptor, value: Any) -> Any:
    """`"text2image"` -> `"TASK_TEXT2IMAGE"`: short, case-insensitive enum names."""
    enum = field.enum_type
    if enum is None or not isinstance(value, str) or value in enum.values_by_name:
        return value
    wanted = value.upper()
    for name in enum.values_by_name:
        if name == wanted or name.endswith("_" + wanted):
            return name
    return value  # json_format reports it with the field's path


def normalize(data: Any, descriptor: Descriptor) -> Any:
    """Accept short enum names anywhere in a JSON message (maps and well-known types as they are)."""
    if not isinstance(data, dict) or descriptor.full_name.startswith("google.protobuf."):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None or value is None:
            out[key] = value
            continue
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        if field.type == FieldDescriptor.TYPE_ENUM:
            values = value if isinstance(value, list) else [value]
            fixed = [_enum_value(field, v) for v in values]
            out[key] = fixed if isinstance(value, list) else fixed[0]
        elif field.message_type is not None and not is_map:
            if isinstance(value, list):
                out[key] = [normalize(v, field.message_type) for v in value]
            else:
                out[key] = normalize(value, field.message_type)
        else:
            out[key] = value
    return out


def _query_value(field: FieldDescriptor, raw: str) -> Any:
    if field.type == FieldDescriptor.TYPE_BOOL:
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return raw


def _from_query(query: Mapping[str, str], descriptor: Descriptor, skip: set[str]) -> dict[str, Any]:
    """Query parameters as a JSON message: repeated keys (or comma lists) for repeated fields."""
    data: dict[str, Any] = {}
    keys = getattr(query, "keys", lambda: query)()
    for key in dict.fromkeys(keys):
        if key in skip:
            continue
        values = query.getall(key) if hasattr(query, "getall") else [query[key]]
        name = key if key in descriptor.fields_by_name else _snake(key)
        field = descriptor.fields_by_name.get(name)
        if field is None or field.message_type is not None:
            raise bad_request(f"not a query parameter of this route ({descriptor.name})", key)
        if field.is_repeated:
            data[name] = [_query_value(field, x) for v in values for x in v.split(",") if x]
        else:
            data[name] = _query_value(field, values[-1])
    return data


def build_request(
    route_body: str,
    descriptor: Descriptor,
    path_params: Mapping[str, str],
    query: Mapping[str, str],
    body: dict[str, Any] | None,
) -> Message:
    """Bind path, query and body into the RPC's request message (a 400 on any fault)."""
    data = _from_query(query, descriptor, {ASYNC_KEY})
    if route_body == "*":
        data.update(body or {})
    elif route_body:
        data[route_body] = body or {}
    for key, value in path_params.items():
        field = descriptor.fields_by_name.get(key)
        integer = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32)
        if field is not None and field.cpp_type in integer and not value.isdigit():
            raise bad_request(f"must be a non-negative integer (got {value!r})", key)
        data[key] = value
    msg = message_class(descriptor)()
    try:
        json_format.ParseDict(normalize(data, descriptor), msg)
    except json_format.ParseError as exc:
        raise _parse_error(exc) from None
    return msg


async def read_json(request: web.Request) -> dict[str, Any] | None:
    """The JSON object in the body (None when empty); 415 for another content type, 400 if malformed."""
    if not request.body_exists:
        return None
    if request.content_type not in ("application/json", "text/json") and not request.content_type.endswith(
        "+json"
    ):
        raise HttpError(415, f"expected Content-Type application/json, got {request.content_type or 'none'}")
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HttpError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise HttpError(400, f"the JSON body must be an object, not {type(data).__name__}")
    return data


def flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
        "0",
        "false",
        "no",
        "off",
        "",
    ):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise bad_request(f"must be a boolean (got {value!r})", ASYNC_KEY)


def artifact_url(request: web.Request, job_id: str, index: int) -> str:
    return f"{request.url.origin()}/v1/jobs/{job_id}/artifacts/{index}"


def artifact_links(data: Any, origin: str) -> Any:
    """`omnirt://jobs/ID/artifacts/N` references as URLs of this gateway."""
    if isinstance(data, dict):
        return {
            k: (
                origin + "/v1/" + v.removeprefix("omnirt://")
                if k == "uri" and isinstance(v, str) and v.startswith(ARTIFACT_URI)
                else artifact_links(v, origin)
            )
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [artifact_links(v, origin) for v in data]
    return data
