"""How the CLI prints: error lines, tables, key/value blocks, JSON and the run report line."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TextIO

from omnirt._internal import jsonable as _json
from omnirt.errors import OmniRTError
from omnirt.types import GenerateResult


def error_line(exc: OmniRTError) -> str:
    """`error: CODE: [field: ]message` — the field only when the message does not name it."""
    message = exc.message
    if exc.field and exc.field not in message:
        message = f"{exc.field}: {message}"
    line = f"error: {exc.code.name}: {message}"
    if exc.retry_after_s is not None:
        line += f" (retry after {exc.retry_after_s:g} s)"
    return line


def error_object(
    code: str,
    message: str,
    *,
    field: str = "",
    subject: str = "",
    retry_after_s: float | None = None,
    violations: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """What `--json` prints for an error: `{"error": {...}}`, with the same keys every time
    (`violations`: every field at fault, the first being `field`)."""
    return {
        "error": {
            "code": code,
            "message": message,
            "field": field,
            "subject": subject,
            "retry_after_s": retry_after_s,
            "violations": [{"field": f, "description": d} for f, d in violations],
        }
    }


def print_error(exc: OmniRTError, *, json_output: bool) -> None:
    """The error line on stderr; with --json also its object, one line on stdout (so it can end
    a JSON Lines stream such as `jobs watch --json`)."""
    print(error_line(exc), file=sys.stderr)
    if json_output:
        error = error_object(
            exc.code.name,
            exc.message,
            field=exc.field,
            subject=exc.subject,
            retry_after_s=exc.retry_after_s,
            violations=exc.violations,
        )
        print_json(error, compact=True)


def print_json(value: Any, *, compact: bool = False, file: TextIO | None = None) -> None:
    """One JSON document on stdout (compact: one line, for streams of objects)."""
    print(_json.dumps(value, indent=None if compact else 2), file=file or sys.stdout, flush=compact)


def print_table(header: Sequence[str], rows: Iterable[Sequence[Any]], *, empty: str = "") -> None:
    """Left-aligned columns separated by two spaces; `empty` goes to stderr when there are no rows."""
    text_rows = [[_cell(v) for v in row] for row in rows]
    if not text_rows:
        if empty:
            print(empty, file=sys.stderr)
        return
    widths = [max(len(r[i]) for r in [list(header), *text_rows]) for i in range(len(header))]
    for row in [list(header), *text_rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def print_fields(pairs: Iterable[tuple[str, Any]]) -> None:
    """`name  value` lines, aligned; empty values are skipped, list values continue on new lines."""
    items = [(k, v) for k, v in pairs if v not in (None, "", [], {}, ())]
    width = max((len(k) for k, _ in items), default=0)
    for key, value in items:
        lines = [_cell(v) for v in value] if isinstance(value, list) else [_cell(value)]
        print(f"{key.ljust(width)}  {lines[0]}")
        for line in lines[1:]:
            print(f"{' ' * width}  {line}")


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={fmt_value(v)}" for k, v in value.items()) or "-"
    return str(getattr(value, "value", value))


def fmt_value(value: Any) -> str:
    """A config value as people write it: strings bare, the rest as JSON.

    Struct fields carry every number as a float; whole ones print as integers (`steps=4`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def fmt_time(value: datetime | None) -> str:
    """Local time to the second, `-` when unset."""
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def fmt_ms(ms: float) -> str:
    """`812 ms` below a second, else `1.10 s`."""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def _seeds(seeds: list[int]) -> str:
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def report_line(result: GenerateResult, elapsed_s: float | None = None) -> str:
    """One line on how a result was made, e.g.
    `tiny-sd text2image 64x64 · 4 steps · seed 42 · worker w-1 · queue 3 ms · load 812 ms (cold) ·
    denoise 150 ms · total 1.10 s`. `elapsed_s` is the time the caller waited (else queue +
    execution)."""
    report, config = result.report, result.report.config_resolved
    first = result.artifacts[0] if result.artifacts else None
    # What was made, as the artifact says (null's dot is 8x8 whatever was asked), else the request.
    width = (first.width if first else 0) or config.get("width")
    height = (first.height if first else 0) or config.get("height")
    head = [report.model or str(config.get("model", "")), report.task.value if report.task else ""]
    if width and height:
        head.append(f"{int(width)}x{int(height)}")
    parts = [" ".join(p for p in head if p)]
    frames = config.get("num_frames") or (first.num_frames if first else 0)
    if frames:
        parts.append(f"{int(frames)} frames")
    if config.get("num_inference_steps"):
        parts.append(f"{int(config['num_inference_steps'])} steps")
    seeds = list(report.seeds) or ([int(config["seed"])] if config.get("seed") is not None else [])
    if seeds:
        parts.append(_seeds(seeds))
    if len(result.artifacts) > 1:
        parts.append(f"{len(result.artifacts)} outputs")
    if report.worker_id:
        parts.append(f"worker {report.worker_id}")
    if report.batch_size > 1:
        parts.append(f"batch {report.batch_size}")
    parts.append(f"queue {fmt_ms(report.queue_wait_ms)}")
    for timing in report.timings:
        cold = " (cold)" if timing.name == "load" and report.cold_start else ""
        parts.append(f"{timing.name} {fmt_ms(timing.duration_ms)}{cold}")
    if report.cold_start and report.timing("load") is None:
        parts.append("cold start")
    total_s = elapsed_s if elapsed_s is not None else (report.queue_wait_ms + report.execution_ms) / 1000
    parts.append(f"total {total_s:.2f} s")
    return " · ".join(p for p in parts if p)
