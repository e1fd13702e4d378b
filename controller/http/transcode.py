"""The generic JSON <-> proto transcoder: one route table over the public gRPC methods.

Each route names an RPC of `omnirt.v1`; its request and response types come from the
service descriptors and its JSON from `google.protobuf.json_format` (proto field names;
lowerCamelCase is accepted on input; enums by name, or by their short name: `"text2image"`
for `TASK_TEXT2IMAGE`). Path parameters, query parameters and the JSON body fill the request
message like `google.api.http` bindings do (`body="*"`: the body is the message,
`body="request"`: the body is that field); the call goes to the same servicer (and so the same
engine) the gRPC server uses. Four kinds of route: unary JSON, a server stream as Server-Sent
Events, as a WebSocket, or as a raw download.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from google.protobuf import descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message

from omnirt._internal import convert as c
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.bounds import shown
from omnirt.controller.core.engine_client import EngineClient
from omnirt.controller.http.errors import HttpError, bad_request
from omnirt.types import Job

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
    # Answers a job of the original OmniRT's shape in that shape (`?shape=`: original_shape.py).
    shaped: bool = False


ROUTES: tuple[Route, ...] = (
    Route(
        "POST",
        "/v1/generate",
        "GenerationService.Generate",
        body="*",
        async_rpc="GenerationService.Submit",
        async_body="request",
        shaped=True,
    ),
    Route("POST", "/v1/jobs", "GenerationService.Submit", body="request", status=202),
    Route("GET", "/v1/jobs", "GenerationService.ListJobs"),
    Route("GET", "/v1/jobs/{job_id}", "GenerationService.GetJob", shaped=True),
    Route("DELETE", "/v1/jobs/{job_id}", "GenerationService.CancelJob", shaped=True),
    Route("GET", "/v1/jobs/{job_id}/events", "GenerationService.WatchJob", kind=SSE, shaped=True),
    Route("GET", "/v1/jobs/{job_id}/stream", "GenerationService.WatchJob", kind=WEBSOCKET, shaped=True),
    Route("GET", "/v1/jobs/{job_id}/artifacts/{index}", "GenerationService.DownloadArtifact", kind=DOWNLOAD),
    Route("POST", "/v1/validate", "GenerationService.Validate", body="request"),
    Route("GET", "/v1/webhooks/secret", "GenerationService.GetWebhookSecret"),
    # /v1/models is OpenAI's shape (openai_models.py); the full ModelSpec lives here.
    Route("GET", "/v1/omnirt/models", "ModelService.ListModels"),
    Route("GET", "/v1/omnirt/models/{model}", "ModelService.DescribeModel"),
    Route("GET", "/v1/workers", "ClusterService.ListWorkers"),
    Route("POST", "/v1/workers/{worker_id}/drain", "ClusterService.DrainWorker"),
)
PACKAGE = "omnirt.v1"
# `?shape=omnirt|original` on a shaped route: which shape to answer in (not a request field).
SHAPE_KEY = "shape"
ARTIFACT_URI = "omnirt://jobs/"
# Deeper JSON is refused before it reaches protobuf (which stops at 100) or a pipeline's extras.
MAX_JSON_DEPTH = 64
# The longest integer literal a double holds (1.8e308 has 309 digits); longer ones, like NaN and
# Infinity (which Python's json takes and JSON does not have), fit no field of the API.
MAX_INT_DIGITS = 308
JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}


class Gateway(Protocol):
    """What a module of routes (the OpenAI-compatible ones) uses of the HTTP gateway
    (`app.HttpGateway`, which registers them: they take this, so they do not import it back).

    `call` and `stream` run an RPC of `ROUTES`' kind in process, as the request's caller."""

    @property
    def engine(self) -> EngineClient: ...
    @property
    def artifacts(self) -> ArtifactStore | None: ...
    @property
    def servicers(self) -> Mapping[str, Any]: ...
    async def call(self, rpc: str, msg: Message, request: web.Request) -> Any: ...
    def stream(self, rpc: str, msg: Message, request: web.Request) -> AsyncGenerator[Any, None]: ...
    def request_type(self, rpc: str) -> Descriptor: ...
    async def expect_continue(self, request: web.Request) -> web.StreamResponse | None: ...


def method_of(rpc: str) -> MethodDescriptor:
    """The descriptor of `Service.Method` in the public package."""
    service, name = rpc.split(".")
    pool = descriptor_pool.Default()
    return pool.FindServiceByName(f"{PACKAGE}.{service}").methods_by_name[name]


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def to_json(msg: Message) -> dict[str, Any]:
    """A message as JSON: proto field names, fields without presence always printed, integral
    numbers as integers (a Struct's `64.0` is `64`)."""
    data: dict[str, Any] = c.integral(
        json_format.MessageToDict(
            msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    )
    return data


# ---- JSON -> message ----------------------------------------------------------------------

_NO_FIELD = re.compile(r'has no field named "([^"]+)"')
_AT_PATH = re.compile(r"\bat \"?[A-Za-z0-9_]+\.?([A-Za-z0-9_.\[\]]*?)\"?\.*$")
_PARSE_FIELD = re.compile(r"Failed to parse ([A-Za-z0-9_]+) field")


def _in_body(field: str, binding: str) -> str:
    """A field's path as the client wrote it: without the message field the body is bound to."""
    if binding in ("", "*") or not (field == binding or field.startswith(binding + ".")):
        return field
    return field[len(binding) + 1 :]


def _parse_error(exc: json_format.ParseError, binding: str) -> HttpError:
    text = str(exc).split("\n")[0].strip()
    at = _AT_PATH.search(text)  # "... at GenerateRequest.inputs[0].role"
    # no "at": "Failed to parse output field: Failed to parse format field: ..."
    path = at.group(1) if at and at.group(1) else ".".join(_PARSE_FIELD.findall(text))
    unknown = _NO_FIELD.search(text)
    field = _in_body(".".join(p for p in (path, unknown.group(1) if unknown else "") if p), binding)
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


def normalize(data: Any, descriptor: Descriptor, path: str = "") -> Any:
    """Accept short enum names anywhere in a JSON message (maps and well-known types as they are).

    A message field that is not a JSON object is a 400 naming it (json_format would read a
    string's characters as field names).
    """
    if not isinstance(data, dict) or descriptor.full_name.startswith("google.protobuf."):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None or value is None:
            out[key] = value
            continue
        name = f"{path}.{key}" if path else key
        message = field.message_type
        if field.type == FieldDescriptor.TYPE_ENUM:
            values = value if isinstance(value, list) else [value]
            fixed = [_enum_value(field, v) for v in values]
            out[key] = fixed if isinstance(value, list) else fixed[0]
        elif message is not None and not message.GetOptions().map_entry:
            if isinstance(value, list):
                out[key] = [normalize(v, message, f"{name}[{i}]") for i, v in enumerate(value)]
            else:
                if not isinstance(value, dict) and not message.full_name.startswith("google.protobuf."):
                    raise bad_request(f"must be a JSON object, not {json_type(value)}", name)
                out[key] = normalize(value, message, name)
        else:
            out[key] = value
    return out


def json_type(value: Any) -> str:
    return "null" if value is None else JSON_TYPES.get(type(value), type(value).__name__)


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
    skip: tuple[str, ...] = (),
) -> Message:
    """Bind path, query and body into the RPC's request message (a 400 on any fault); the query
    parameters in `skip` are the gateway's, not the message's."""
    # Normalized apart, so that a fault in the body is named by its path in the body.
    data = normalize(_from_query(query, descriptor, {ASYNC_KEY, *skip}), descriptor)
    if route_body == "*":
        data.update(normalize(body or {}, descriptor))
    elif route_body:
        bound = descriptor.fields_by_name[route_body].message_type
        data[route_body] = normalize(body or {}, bound) if bound is not None else body or {}
    for key, value in path_params.items():
        field = descriptor.fields_by_name.get(key)
        integer = (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32)
        if field is not None and field.cpp_type in integer and not (value.isascii() and value.isdigit()):
            raise bad_request(f"must be a non-negative integer (got {value[:32]!r})", key)
        data[key] = value
    msg = message_class(descriptor)()
    try:
        json_format.ParseDict(data, msg)
    except json_format.ParseError as exc:
        raise _parse_error(exc, route_body) from None
    return msg


async def read_json(request: web.Request) -> dict[str, Any] | None:
    """The JSON object in the body (None when empty); 415 for another content type, 400 if malformed."""
    if not request.body_exists:
        return None
    if request.content_type != "application/json":  # multipart reaches here, on a JSON-only route
        raise HttpError(415, f"expected Content-Type application/json, got {request.content_type or 'none'}")
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        data = json.loads(raw, parse_constant=NonFinite, parse_int=_integer)
    except RecursionError:
        raise HttpError(400, f"malformed JSON body: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise HttpError(400, f"malformed JSON body: {exc}") from None
    if not isinstance(data, dict):
        raise HttpError(400, f"the JSON body must be an object, not {json_type(data)}")
    check_json(data)
    return data


_SURROGATE = "not Unicode text (an unpaired surrogate escape such as \\ud800)"


def is_text(value: str) -> bool:
    """False for a string with an unpaired surrogate (isascii is O(1): most strings stop there)."""
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class NonFinite(str):
    """A JSON number no field can hold: NaN, Infinity, or an integer longer than MAX_INT_DIGITS."""


def _integer(text: str) -> int | NonFinite:
    return NonFinite(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def check_json(data: Any) -> None:
    """400 naming the field for a value nested deeper than MAX_JSON_DEPTH, a non-finite number,
    or a string with an unpaired surrogate (a `\\ud800` escape: no UTF-8 holds it, and protobuf
    and the upb lookups behind it raise on it, a 500 before)."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise bad_request(f"nested deeper than {MAX_JSON_DEPTH} levels", re.split(r"[.\[]", path)[0])
        if isinstance(value, dict):
            for k, v in value.items():
                name = f"{path}.{k}" if path else k
                if not is_text(k):
                    raise bad_request(_SURROGATE, ascii(name)[1:-1])
                stack.append((v, name, depth + 1))
        elif isinstance(value, str) and not is_text(value):
            raise bad_request(_SURROGATE, path)
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
        elif isinstance(value, NonFinite) or (isinstance(value, float) and not math.isfinite(value)):
            text = str(value)
            quoted = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} digits)"
            raise bad_request(f"must be a finite number a double can hold (got {quoted})", path)


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
    raise bad_request(f"must be a boolean (got {shown(value)})", ASYNC_KEY)


def artifact_url(request: web.Request, job_id: str, index: int) -> str:
    return f"{request.url.origin()}/v1/jobs/{job_id}/artifacts/{index}"


def job_json(job: Job, origin: str) -> dict[str, Any]:
    """A job as the gateway answers `GET /v1/jobs/{id}`, its artifact references as links of the
    gateway at `origin` ("" leaves them `omnirt://` references). Webhook payloads carry this
    (the server hands it to the webhook dispatcher: webhooks import no HTTP module)."""
    data = to_json(c.job_to_proto(job))
    if origin:
        data = artifact_links(data, origin)
    return data


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
