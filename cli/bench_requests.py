"""`omnirtctl bench --request-file`: requests as JSON, the same shape the HTTP gateway takes.

A file holds one `GenerateRequest` (a JSON object, pretty-printed or not), a JSON array of
them, or JSON Lines (one object per line; blank lines are skipped). The JSON is the proto3
mapping of `omnirt.v1.GenerateRequest`: proto field names (`num_inference_steps`) or
lowerCamelCase, enums by full or short name in any case (`"task": "text2image"`), bytes as
base64, `extra` any JSON object.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from omnirt._internal import convert as conv
from omnirt.types import GenerateRequest
from omnirt.v1 import types_pb2

# The generated stubs type DESCRIPTOR as the C or the Python descriptor; both have one API.
_REQUEST = cast(Descriptor, types_pb2.GenerateRequest.DESCRIPTOR)


_NO_FIELD = re.compile(r'has no field named "([^"]+)"')
_PARSE_FIELD = re.compile(r"Failed to parse ([A-Za-z0-9_]+) field: ")
_AT_PATH = re.compile(r"\s+at \"?[A-Za-z0-9_.\[\]]+\"?\.?$")


def _parse_error(exc: json_format.ParseError) -> str:
    """json_format's message as `field: reason` (`output.format: ...`, `foo: unknown field`)."""
    text = str(exc).splitlines()[0].strip()
    path = _PARSE_FIELD.findall(text)
    if match := _NO_FIELD.search(text):
        return ".".join([*path, match.group(1)]) + ": unknown field"
    reason = _AT_PATH.sub("", _PARSE_FIELD.sub("", text)).rstrip(".")
    return f"{'.'.join(path)}: {reason}" if path else reason


class RequestFileError(ValueError):
    """The file cannot be read or holds something that is not a request; the message says where."""


def _enum_name(field: FieldDescriptor, value: Any) -> Any:
    """`"text2image"` -> `"TASK_TEXT2IMAGE"` (short names, any case); other values as they are."""
    enum = field.enum_type
    if enum is None or not isinstance(value, str) or value in enum.values_by_name:
        return value
    wanted = value.upper()
    for name in enum.values_by_name:
        if name == wanted or name.endswith("_" + wanted):
            return name
    return value  # json_format names the field and the bad value


def _short_enums(data: Any, descriptor: Descriptor) -> Any:
    """Accept short enum names anywhere in a request (maps and Struct values left as they are)."""
    if not isinstance(data, dict) or descriptor.full_name.startswith("google.protobuf."):
        return data
    out: dict[str, Any] = {}
    for key, value in data.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None or value is None:
            out[key] = value
        elif field.type == FieldDescriptor.TYPE_ENUM:
            out[key] = (
                [_enum_name(field, v) for v in value] if isinstance(value, list) else _enum_name(field, value)
            )
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            sub = field.message_type
            out[key] = (
                [_short_enums(v, sub) for v in value] if isinstance(value, list) else _short_enums(value, sub)
            )
        else:
            out[key] = value
    return out


def parse_request(data: Any) -> GenerateRequest:
    """One JSON object -> `GenerateRequest`; ValueError says which field is wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    msg = types_pb2.GenerateRequest()
    try:
        json_format.ParseDict(_short_enums(data, _REQUEST), msg)
    except json_format.ParseError as exc:
        raise ValueError(_parse_error(exc)) from None
    if not msg.model:
        raise ValueError("model: required")
    return conv.request_from_proto(msg)


def _documents(text: str) -> list[tuple[int, Any]]:
    """(line number, JSON value) per request: a whole document, an array, or JSON Lines."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        pass
    else:
        return list(enumerate(whole, 1)) if isinstance(whole, list) else [(1, whole)]
    documents = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            documents.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise RequestFileError(f"line {number}: not valid JSON ({exc.msg})") from None
    return documents


def load_requests(path: Path) -> list[GenerateRequest]:
    """Every request in the file, in order; RequestFileError on the first fault (with its line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise RequestFileError(f"cannot read it ({reason})") from None
    documents = _documents(text)
    if not documents:
        raise RequestFileError("no requests in it")
    requests = []
    for number, data in documents:
        try:
            requests.append(parse_request(data))
        except ValueError as exc:
            where = f"request {number}" if text.lstrip().startswith("[") else f"line {number}"
            raise RequestFileError(f"{where}: {exc}") from None
    return requests
