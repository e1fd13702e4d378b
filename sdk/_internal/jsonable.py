"""JSON rendering of the SDK's dataclasses (the CLI's `--json`).

Datetimes become ISO 8601 strings, enums their values, paths strings; bytes fields (artifact
data, previews) are left out, so the keys of a type are always the same.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from datetime import datetime
from pathlib import PurePath
from typing import Any


def to_jsonable(value: Any) -> Any:
    """`value` as plain JSON types (dict, list, str, int, float, bool, None)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_jsonable(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if not isinstance(getattr(value, f.name), bytes | bytearray)
        }
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return {"size_bytes": len(value)}
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """`value` as a JSON document (one line unless `indent` is given)."""
    return json.dumps(to_jsonable(value), indent=indent, ensure_ascii=False)
