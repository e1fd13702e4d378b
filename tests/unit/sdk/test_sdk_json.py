"""JSON rendering of the dataclasses (what `omnirtctl --json` prints)."""

from __future__ import annotations

import json

from sdk_fake_server import T0, sample_result

from omnirt._internal.jsonable import dumps, to_jsonable
from omnirt.types import EventKind, JobEvent, JobState


def test_result_renders_without_bytes_and_with_iso_times() -> None:
    data = to_jsonable(sample_result())
    artifact = data["artifacts"][0]
    assert "data" not in artifact
    assert artifact["size_bytes"] == len(b"\x89PNG\r\n\x1a\n" + b"fake image bytes")
    assert artifact["kind"] == "image"
    assert data["report"]["task"] == "text2image"
    assert data["report"]["started_at"] == "2025-01-02T03:04:05+00:00"
    assert data["report"]["timings"][0] == {"name": "load", "duration_ms": 812.0, "start_offset_ms": 0.0}
    json.dumps(data)  # plain JSON types only


def test_keys_do_not_depend_on_values() -> None:
    empty = to_jsonable(JobEvent("j", EventKind.LOG))
    full = to_jsonable(JobEvent("j", EventKind.STATE, state=JobState.FAILED, time=T0, preview=b"x"))
    assert list(empty) == list(full)
    assert "preview" not in full
    assert full["state"] == "failed" and full["time"] == "2025-01-02T03:04:05+00:00"


def test_dumps_is_one_line_by_default() -> None:
    assert "\n" not in dumps(sample_result())
    assert dumps({"a": [1]}, indent=2) == '{\n  "a": [\n    1\n  ]\n}'
