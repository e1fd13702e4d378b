"""`omnirtctl bench --request-file`: requests as JSON, the same shape the HTTP gateway takes.

A file holds one `GenerateRequest` (a JSON object, pretty-printed or not), a JSON array of
them, or JSON Lines (one object per line; blank lines are skipped). The JSON is the proto3
mapping of `omnirt.v1.GenerateRequest`: proto field names (`num_inference_steps`) or
lowerCamelCase, enums by full or short name in any case (`"task": "text2image"`), bytes as
base64, `extra` any JSON object (`omnirt._internal.requests.request_from_json` reads it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnirt._internal.requests import request_from_json
from omnirt.types import GenerateRequest


class RequestFileError(ValueError):
    """The file cannot be read or holds something that is not a request; the message says where."""


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
            requests.append(request_from_json(data))
        except ValueError as exc:
            where = f"request {number}" if text.lstrip().startswith("[") else f"line {number}"
            raise RequestFileError(f"{where}: {exc}") from None
    return requests
