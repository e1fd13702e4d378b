"""Reading OpenAI-style parameters (JSON bodies or multipart forms) into a `GenerateRequest`.

OpenAI's own parameters (model, prompt, n, size, output_format, output_compression) map to the
request's fields; OmniRT's extras ride along as extra body fields (`seed`, `negative_prompt`,
`num_inference_steps`, `guidance_scale`, ...). Parameters OpenAI has and OmniRT does not use
(quality, style, user, background, moderation, ...) are accepted and ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from omnirt.controller.core.bounds import shown
from omnirt.controller.http.errors import HttpError, bad_request
from omnirt.controller.http.transcode import is_text, read_json
from omnirt.types import GenerateRequest, Task, Webhook, WebhookEvent

# Image signatures -> MIME type (the controller does not decode images; the worker does).
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
FORMAT_ALIASES = {"jpg": "jpeg"}
# The request's integers are int32 unless said otherwise (seed, timeout_ms: int64), its numbers
# float32: a larger value would fail in the proto, not name its field.
INT32 = (-(2**31), 2**31 - 1)
INT64 = (-(2**63), 2**63 - 1)
FLOAT32_MAX = 3.4028234663852886e38


def sniff_image(data: bytes) -> str:
    """The MIME type of PNG, JPEG, WEBP or GIF bytes, or ''."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return next((mime for magic, mime in _MAGIC if data.startswith(magic)), "")


def png_size(data: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG header."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n") or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


class Params:
    """Typed access to request parameters; a wrong value is a 400 naming the parameter."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.data = data

    def __contains__(self, name: str) -> bool:
        return self.data.get(name) not in (None, "")

    def text(self, name: str, default: str = "", *, required: bool = False) -> str:
        value = self.data.get(name)
        if value in (None, ""):
            if required:
                raise bad_request("required", name)
            return default
        if not isinstance(value, str):
            raise bad_request(f"must be a string (got {type(value).__name__})", name)
        return value

    def integer(self, name: str, *, minimum: int = INT32[0], maximum: int = INT32[1]) -> int | None:
        value = self.data.get(name)
        if value in (None, ""):
            return None
        try:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            number = int(value)
        except (TypeError, ValueError):
            raise bad_request(f"must be an integer (got {shown(value)})", name) from None
        if number < minimum:
            raise bad_request(f"must be at least {minimum} (got {shown(number)})", name)
        if number > maximum:
            raise bad_request(f"must be at most {maximum} (got {shown(number)})", name)
        return number

    def number(self, name: str) -> float | None:
        """A finite number a float32 holds ("inf", "nan" and 1e308 are 400s, not a lost job)."""
        value = self.data.get(name)
        if value in (None, ""):
            return None
        try:
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
        except (TypeError, ValueError):
            raise bad_request(f"must be a number (got {shown(value)})", name) from None
        if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
            raise bad_request(f"must be a finite number within float32 range (got {shown(value)})", name)
        return number

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.text(name, default)
        if value not in choices:
            raise bad_request(f"must be one of {', '.join(choices)} (got {shown(value)})", name)
        return value

    def flag(self, name: str) -> bool:
        value = self.data.get(name)
        return value is True or (isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"))

    def size(self) -> tuple[int, int] | None:
        """`size` as (width, height); None for absent or `auto` (the model's default)."""
        value = self.text("size", "auto")
        if value == "auto":
            return None
        width, sep, height = value.lower().partition("x")
        fits = (v.isascii() and v.isdigit() and len(v) <= 10 and int(v) <= INT32[1] for v in (width, height))
        if not sep or not all(fits):
            raise bad_request(f"must be WIDTHxHEIGHT, e.g. 512x512, or auto (got {shown(value)})", "size")
        return int(width), int(height)


def generate_request(params: Params, task: Task) -> GenerateRequest:
    """The request common to the images and videos routes."""
    if params.flag("stream"):
        raise bad_request(
            "streaming responses are not supported; watch /v1/jobs/{id}/events instead", "stream"
        )
    req = GenerateRequest(
        model=params.text("model", required=True),
        task=task,
        prompt=params.text("prompt", required=True),
        negative_prompt=params.text("negative_prompt"),
        scheduler=params.text("scheduler"),
        preset=params.text("preset"),
        num_outputs=params.integer("n", minimum=1, maximum=128),
        num_inference_steps=params.integer("num_inference_steps"),
        guidance_scale=params.number("guidance_scale"),
        seed=params.integer("seed", minimum=INT64[0], maximum=INT64[1]),
        strength=params.number("strength"),
        priority=params.integer("priority") or 0,
        timeout_ms=params.integer("timeout_ms", minimum=0, maximum=INT64[1]) or 0,
        idempotency_key=params.text("idempotency_key"),
    )
    size = params.size()
    if size is not None:
        req.width, req.height = size
    fmt = params.text("output_format").lower()
    req.output_format = FORMAT_ALIASES.get(fmt, fmt)
    req.quality = params.integer("output_compression", minimum=0, maximum=100) or 0
    extra = params.data.get("extra")
    if extra is not None:
        if not isinstance(extra, dict):
            raise bad_request("must be an object", "extra")
        req.extra = dict(extra)
    req.webhook = webhook_param(params)
    return req


def webhook_param(params: Params) -> Webhook | None:
    """OmniRT's `webhook` (a URL) and `webhook_events` (a list, or names separated by commas),
    as the SDK takes them; the URL itself is checked by the servicer like any request's."""
    url = params.text("webhook")
    raw = params.data.get("webhook_events")
    if not url:
        if raw not in (None, ""):
            raise bad_request("needs webhook (the URL to deliver them to)", "webhook_events")
        return None
    names = raw.split(",") if isinstance(raw, str) else raw if raw is not None else []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("must be a list of event names", "webhook_events")
    known = {e.value: e for e in WebhookEvent}
    events = []
    for name in (n.strip().lower() for n in names if n.strip()):
        if name not in known:
            raise bad_request(f"unknown event {shown(name)} (known: {', '.join(known)})", "webhook_events")
        events.append(known[name])
    return Webhook(url=url, events=events)


async def read_params(request: web.Request, *, multipart: bool) -> tuple[Params, dict[str, list[bytes]]]:
    """JSON body or multipart form -> (parameters, uploaded files by field name)."""
    if request.content_type == "application/json" and not multipart:
        return Params(await read_json(request) or {}), {}
    if request.content_type != "multipart/form-data":
        wanted = "multipart/form-data" if multipart else "application/json or multipart/form-data"
        raise HttpError(415, f"expected Content-Type {wanted}, got {request.content_type or 'none'}")
    try:
        values, files = await _multipart(request)
    except (ValueError, HttpProcessingError) as exc:  # no boundary, a cut body, a bad part header
        raise bad_request(f"malformed multipart body: {shown(str(exc).strip())}") from None
    return Params(values), files


async def _multipart(request: web.Request) -> tuple[dict[str, Any], dict[str, list[bytes]]]:
    """The form's text fields and files; a text field that is not UTF-8 is a 400 naming it.

    Read part by part (not `request.post()`, whose UnicodeDecodeError names no field), counting
    the bytes against the body limit as `post()` does.
    """
    values: dict[str, Any] = {}
    files: dict[str, list[bytes]] = {}
    total = 0
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise bad_request("a nested multipart part is not supported")
        name = (part.name or "").removesuffix("[]")
        data = bytearray()
        while chunk := await part.read_chunk():
            total += len(chunk)
            if total > request.client_max_size:
                raise HttpError(413, f"request body too large (over {request.client_max_size} bytes)")
            data += chunk
        if part.filename:
            files.setdefault(name, []).append(bytes(data))
            continue
        charset = part.get_charset("utf-8")
        try:
            text = data.decode(charset)
        except (UnicodeDecodeError, LookupError):
            text = None
        # A charset may decode to an unpaired surrogate (utf-7, unicode_escape): no protobuf holds it.
        if text is None or not is_text(text):
            raise bad_request(f"not text in its charset ({shown(charset)})", name)
        values[name] = text
    return values, files
