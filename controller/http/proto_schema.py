"""JSON Schemas (OpenAPI 3.1) of protobuf messages, in the proto3 JSON mapping the gateway speaks.

Field names are the proto names (the gateway prints them; lowerCamelCase is accepted on input),
64-bit integers are strings, enums their value names (the gateway also takes the short name,
`text2image` for `TASK_TEXT2IMAGE`), bytes base64, and the well-known types their JSON forms
(Timestamp an RFC 3339 string, Struct an object). Each message is one component, named by its
full name (`omnirt.v1.Job`), so recursive messages are references.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

F = FieldDescriptor
INT32 = (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32)
UINT32 = (F.TYPE_UINT32, F.TYPE_FIXED32)
INT64 = (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64)
UINT64 = (F.TYPE_UINT64, F.TYPE_FIXED64)
WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time"},
    "google.protobuf.Duration": {"type": "string", "description": "seconds with an s suffix, e.g. 1.5s"},
    "google.protobuf.Struct": {"type": "object"},
    "google.protobuf.Value": {},
    "google.protobuf.ListValue": {"type": "array"},
    "google.protobuf.Empty": {"type": "object"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Any": {"type": "object", "properties": {"@type": {"type": "string"}}},
    "google.protobuf.BoolValue": {"type": "boolean"},
    "google.protobuf.StringValue": {"type": "string"},
    "google.protobuf.BytesValue": {"type": "string", "contentEncoding": "base64"},
    "google.protobuf.Int32Value": {"type": "integer", "format": "int32"},
    "google.protobuf.UInt32Value": {"type": "integer", "minimum": 0},
    "google.protobuf.Int64Value": {"type": "string", "format": "int64"},
    "google.protobuf.UInt64Value": {"type": "string", "format": "uint64"},
    "google.protobuf.FloatValue": {"type": "number"},
    "google.protobuf.DoubleValue": {"type": "number"},
}


def _scalar(field: FieldDescriptor) -> dict[str, Any]:
    kind = field.type
    if kind in INT32:
        return {"type": "integer", "format": "int32"}
    if kind in UINT32:
        return {"type": "integer", "format": "int32", "minimum": 0}
    if kind in INT64:
        return {"type": "string", "format": "int64", "pattern": "^-?[0-9]+$"}
    if kind in UINT64:
        return {"type": "string", "format": "uint64", "pattern": "^[0-9]+$"}
    if kind in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
        return {"type": "number"}
    if kind == F.TYPE_BOOL:
        return {"type": "boolean"}
    if kind == F.TYPE_BYTES:
        return {"type": "string", "contentEncoding": "base64"}
    return {"type": "string"}


class Schemas:
    """The components a document refers to, filled as messages are referred to."""

    def __init__(self) -> None:
        self._messages: dict[str, dict[str, Any]] = {}
        self.extra: dict[str, dict[str, Any]] = {}

    def all(self) -> dict[str, dict[str, Any]]:
        return {**self._messages, **self.extra}

    def ref(self, message: Descriptor) -> dict[str, Any]:
        """A reference to `message`'s schema (made, with the schemas it refers to, the first time)."""
        if message.full_name in WELL_KNOWN:
            return dict(WELL_KNOWN[message.full_name])
        name = message.full_name
        if name not in self._messages:
            self._messages[name] = {}  # taken before the fields: a message may contain itself
            self._messages[name] = self._object(message)
        return {"$ref": f"#/components/schemas/{name}"}

    def _object(self, message: Descriptor, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
        properties = {f.name: self.field(f) for f in message.fields if f.name not in skip}
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        oneofs = [o for o in message.oneofs if not o.name.startswith("_")]  # "_x": proto3 optional
        if oneofs:
            schema["description"] = "; ".join(
                f"at most one of {', '.join(f.name for f in o.fields)}" for o in oneofs
            )
        return schema

    def field(self, field: FieldDescriptor) -> dict[str, Any]:
        """The schema of one field's JSON value."""
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            value = message.fields_by_name["value"]
            return {"type": "object", "additionalProperties": self.field(value)}
        if message is not None:
            one = self.ref(message)
        elif field.enum_type is not None:
            one = {"type": "string", "enum": [v.name for v in field.enum_type.values]}
        else:
            one = _scalar(field)
        return {"type": "array", "items": one} if field.is_repeated else one

    def body(self, request: Descriptor, binding: str) -> dict[str, Any]:
        """The body of a route bound with `binding` ("*": the request, or one of its fields)."""
        if binding == "*":
            return self.ref(request)
        return self.field(request.fields_by_name[binding])
