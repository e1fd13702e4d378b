"""What the scenarios of `bench.suite` share: their context, their table rows, verdicts, formats.

A scenario is a module with `NAME`, `TITLE`, a frozen `Settings` dataclass (defaults = the full
run) with a `quick()` variant, `run(settings, ctx) -> dict` (JSON-able numbers plus `rows`, the
lines it adds to the suite's table) and `markdown(result) -> str` (its section of
docs/BENCHMARKS.md, written from the JSON alone).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Context:
    """What the suite hands every scenario."""

    log_dir: Path  # a scratch folder of this scenario: daemon logs, catalogs
    model_dir: Path  # tiny models, built once per suite run
    torch_threads: int  # torch CPU threads, the same in-process and in every worker


@dataclass(frozen=True)
class Row:
    """One line of the suite's table: OmniRT's number next to what it is compared with."""

    scenario: str
    case: str
    omnirt: str
    reference: str = ""
    ratio: float | None = None
    target: str = ""
    verdict: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS = ("scenario", "case", "OmniRT", "compared with", "ratio", "target", "verdict")


def row_cells(row: dict[str, Any]) -> list[str]:
    """The table cells of a row read back from JSON."""
    ratio = row.get("ratio")
    return [
        row["scenario"],
        row["case"],
        row["omnirt"],
        row.get("reference", ""),
        "" if ratio is None else f"{ratio:.2f}",
        row.get("target", ""),
        row.get("verdict", ""),
    ]


def verdict(ratio: float | None, op: str, bound: float) -> str:
    """`met` when `ratio op bound` holds (op is "<=" or ">="), else `missed`; "" without a ratio."""
    if ratio is None:
        return ""
    ok = ratio <= bound if op == "<=" else ratio >= bound
    return "met" if ok else "missed"


def ratio(a: float, b: float, digits: int = 3) -> float | None:
    """a / b rounded, or None when b is 0."""
    return round(a / b, digits) if b else None


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def ms(seconds: float) -> float:
    """Seconds to milliseconds, rounded to 0.01."""
    return round(seconds * 1000.0, 2)


def fmt_rate(per_s: float) -> str:
    return f"{per_s:,.1f}/s"


def fmt_ms(value_ms: float) -> str:
    return f"{value_ms:,.1f} ms" if value_ms >= 10 else f"{value_ms:.2f} ms"


def fmt_counts(counts: dict[Any, int]) -> str:
    """`{size: count}` (keys ints, or strings after a JSON round trip) as "1: 171, 2: 494", by size."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items(), key=lambda kv: int(kv[0])))


def settings_dict(settings: Any) -> dict[str, Any]:
    """A settings dataclass as JSON-able values (tuples become lists)."""
    out: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], right: int = 1) -> str:
    """A markdown table; columns from index `right` on are right-aligned."""
    align = ["---" if i < right else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table with columns as wide as their widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


class Skipped(Exception):
    """A scenario cannot run on this machine (a peer is not installed, ...); the message says why."""


@dataclass(frozen=True)
class Scenario:
    """One scenario of the suite: its settings for the full and the quick run, and its functions."""

    name: str
    title: str
    full: Any  # the Settings of the full run
    quick: Any  # the Settings of `--quick`
    run: Callable[[Any, Context], dict[str, Any]]
    markdown: Callable[[dict[str, Any]], str]
    needs_models: bool = True  # tiny-sd must be built before it runs


def run_alone(
    run: Callable[[Any, Context], dict[str, Any]], settings: Any, ctx: Context, out: Path | None
) -> int:
    """A scenario run by its own module (`python -m bench.X`): its table printed and its JSON
    written to `out`; on a failure, the tails of the daemons' logs in `ctx.log_dir`, and 1."""
    try:
        result = run(settings, ctx)
    except Exception as exc:
        print(f"benchmark failed: {exc!r}", file=sys.stderr)
        for log in sorted(ctx.log_dir.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return 1
    print(text_table(COLUMNS, [row_cells(r) for r in result["rows"]]))
    if out:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
