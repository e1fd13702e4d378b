"""A `GenerateRequest` from a client's keywords, or from JSON; the small parsers they share.

`build_request` is what `Client.generate(model=..., prompt=..., image="photo.png")` (and the
CLI's flags) make of keywords; `request_from_json` reads the proto3 JSON mapping of
`omnirt.v1.GenerateRequest`, the shape the HTTP gateway takes (`omnirtctl bench
--request-file`), so nobody outside the SDK touches the generated message to do it.
"""

from __future__ import annotations

import dataclasses
import mimetypes
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict, cast

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from omnirt import errors
from omnirt._internal import convert as conv
from omnirt.types import (
    Adapter,
    Artifact,
    GenerateRequest,
    JobState,
    MediaInput,
    MediaRole,
    Task,
    Webhook,
    WebhookEvent,
)
from omnirt.v1 import types_pb2

Media = bytes | str | os.PathLike[str]


class RequestFields(TypedDict, total=False):
    """The keyword arguments that build a `GenerateRequest` (see its fields).

    `image`, `mask` and `audio` are shortcuts: bytes, a local path, or a URI
    (`scheme://...`), added to `inputs` with the matching role. Adapters may be given by name.
    `webhook` may be a URL (or a `Webhook`); `webhook_events` picks its events by name
    ("queued", "started", "progress", "completed", "failed", "cancelled"; all when unset).
    A field passed as None is left unset.
    """

    model: str
    task: Task | str
    prompt: str
    negative_prompt: str
    inputs: Sequence[MediaInput]
    image: Media | None
    mask: Media | None
    audio: Media | None
    width: int | None
    height: int | None
    num_frames: int | None
    fps: float | None
    num_inference_steps: int | None
    guidance_scale: float | None
    seed: int | None
    scheduler: str | None
    num_outputs: int | None
    preset: str | None
    adapters: Sequence[Adapter | str]
    priority: int | None
    deadline_ms: int | None
    timeout_ms: int | None
    idempotency_key: str | None
    labels: Mapping[str, str]
    extra: Mapping[str, Any]
    output_format: str | None
    inline_limit_bytes: int | None
    quality: int | None
    strength: float | None
    duration_ms: int | None
    webhook: Webhook | str | None
    webhook_events: Sequence[WebhookEvent | str] | None


_SHORTCUTS = {"image": MediaRole.IMAGE, "mask": MediaRole.MASK, "audio": MediaRole.AUDIO}
_REQUEST_FIELDS = {f.name for f in dataclasses.fields(GenerateRequest)}


def media_input(role: MediaRole | str, value: Media) -> MediaInput:
    """An input from bytes, a local path or a URI (`scheme://...`)."""
    role = MediaRole(role)
    if isinstance(value, bytes | bytearray):
        return MediaInput(role=role, data=bytes(value))
    text = os.fspath(value)
    if isinstance(value, str) and "://" in text:
        return MediaInput(role=role, uri=text)
    media = MediaInput.from_file(role, text)
    media.mime_type = mimetypes.guess_type(text)[0] or ""
    return media


def parse_task(value: Task | str) -> Task:
    """`Task` from its value ("text2image"); InvalidRequest names the known ones."""
    try:
        return Task(value)
    except ValueError:
        known = ", ".join(t.value for t in Task)
        raise errors.InvalidRequest(f"task: unknown task {value!r} (known: {known})", field="task") from None


def parse_state(value: JobState | str) -> JobState:
    """`JobState` from its value ("running"); InvalidRequest names the known ones."""
    try:
        return JobState(value)
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise errors.InvalidRequest(
            f"states: unknown job state {value!r} (known: {known})", field="states"
        ) from None


def artifact_file_name(job_id: str, artifact: Artifact) -> str:
    """The artifact's suggested file name (never a path), else `JOB-INDEX.EXT` from its MIME type."""
    name = Path(artifact.file_name).name
    if name:
        return name
    ext = (mimetypes.guess_extension(artifact.mime_type) or "") if artifact.mime_type else ""
    return f"{job_id}-{artifact.index}{ext}"


def build_request(request: GenerateRequest | None = None, **fields: Any) -> GenerateRequest:
    """A `GenerateRequest` from keywords, or a copy of `request` with the keywords applied."""
    fields = {k: v for k, v in fields.items() if v is not None}
    media = [media_input(role, fields.pop(name)) for name, role in _SHORTCUTS.items() if name in fields]
    if "webhook" in fields or "webhook_events" in fields:
        fields["webhook"] = webhook_of(fields.get("webhook"), fields.pop("webhook_events", None))
    unknown = sorted(set(fields) - _REQUEST_FIELDS)
    if unknown:
        raise TypeError(f"unexpected request field(s): {', '.join(unknown)}")
    if request is None:
        if not fields.get("model"):
            raise TypeError("a request needs model= (or request=GenerateRequest(...))")
        req = GenerateRequest(**fields)
    else:
        req = dataclasses.replace(request, **fields)
    req.task = parse_task(req.task) if req.task else None
    req.inputs = [*req.inputs, *media]
    req.adapters = [a if isinstance(a, Adapter) else Adapter(name=a) for a in req.adapters]
    req.labels = dict(req.labels)
    req.extra = dict(req.extra)
    return req


def webhook_of(webhook: Webhook | str | None, events: Sequence[WebhookEvent | str] | None) -> Webhook:
    """A `Webhook` from a URL or a `Webhook`, with `events` (names) when given."""
    if webhook is None:
        raise TypeError("webhook_events= needs webhook= (the URL to deliver them to)")
    hook = Webhook(url=webhook) if isinstance(webhook, str) else dataclasses.replace(webhook)
    if events is not None:
        if isinstance(events, str):
            events = [events]
        known = ", ".join(e.value for e in WebhookEvent)
        try:
            hook.events = [WebhookEvent(e) for e in events]
        except ValueError as exc:
            raise errors.InvalidRequest(
                f"webhook.events: {exc} (known: {known})", field="webhook.events"
            ) from None
    return hook


# ---- JSON: the proto3 mapping of omnirt.v1.GenerateRequest ----------------------------------

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


def request_from_json(data: Any) -> GenerateRequest:
    """One JSON object (the proto3 mapping) -> `GenerateRequest`; ValueError says which field is wrong.

    Field names as in the proto (`num_inference_steps`) or lowerCamelCase, enums by full or
    short name in any case (`"task": "text2image"`), bytes as base64, `extra` any JSON object.
    """
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
