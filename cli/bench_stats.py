"""What `omnirtctl bench` measures per request, and the report it builds from the samples."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# The failure key of requests the bench itself cut off at its time limit (not a gRPC status:
# the job was still queued or running when `--duration` plus the grace ran out).
UNFINISHED = "UNFINISHED"

PERCENTILES = (50, 95, 99)


@dataclass
class Sample:
    """One measured request: how long it took, how it ended, and what its RunReport said.

    `status` is the gRPC status name of a failure (`RESOURCE_EXHAUSTED`) or `UNFINISHED`, and
    `message` its error message; the report fields are set only for a request that succeeded."""

    latency_s: float
    ok: bool
    status: str = ""
    message: str = ""
    ttfp_s: float | None = None
    queue_wait_ms: float | None = None
    execution_ms: float | None = None
    batch_size: int = 0
    cold_start: bool = False


def percentile(values: Sequence[float], pct: float) -> float | None:
    """The `pct` percentile (0-100) by the nearest-rank method (always an observed value); None for none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def distribution(values: Sequence[float]) -> dict[str, Any]:
    """`{"count", "p50", "p95", "p99", "mean", "max"}` of values in ms (None when there are none)."""
    summary: dict[str, Any] = {"count": len(values)}
    for pct in PERCENTILES:
        value = percentile(values, pct)
        summary[f"p{pct}"] = None if value is None else round(value, 3)
    summary["mean"] = round(sum(values) / len(values), 3) if values else None
    summary["max"] = round(max(values), 3) if values else None
    return summary


def failure_counts(samples: Iterable[Sample]) -> dict[str, int]:
    """Failed requests by status, the most frequent first."""
    counts = Counter(s.status for s in samples if not s.ok)
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def failure_examples(samples: Iterable[Sample]) -> dict[str, str]:
    """The first error message seen per failure status (why the requests failed)."""
    examples: dict[str, str] = {}
    for sample in samples:
        if not sample.ok:
            examples.setdefault(sample.status, sample.message)
    return examples


def bench_report(
    samples: Sequence[Sample],
    *,
    planned: int,
    wall_s: float,
    stopped_by: str,
) -> dict[str, Any]:
    """The measured part of the report (stable keys, see docs/cli.md).

    `planned` is `--total`; `wall_s` the measured window (first submit to last end);
    `stopped_by` is `total` or `duration`. Latency, queue wait and execution percentiles are
    over successful requests; time to first progress over those that reported progress."""
    good = [s for s in samples if s.ok]
    batch_sizes = [max(s.batch_size, 1) for s in good]
    return {
        "planned": planned,
        "total": len(samples),
        "ok": len(good),
        "failed": len(samples) - len(good),
        "not_sent": max(planned - len(samples), 0),
        "stopped_by": stopped_by,
        "wall_s": round(wall_s, 3),
        "throughput_per_s": round(len(good) / wall_s, 3) if wall_s > 0 else 0.0,
        "latency_ms": distribution([s.latency_s * 1000 for s in good]),
        "ttfp_ms": distribution([s.ttfp_s * 1000 for s in good if s.ttfp_s is not None]),
        "queue_wait_ms": distribution([s.queue_wait_ms for s in good if s.queue_wait_ms is not None]),
        "execution_ms": distribution([s.execution_ms for s in good if s.execution_ms is not None]),
        "batch_size_mean": round(sum(batch_sizes) / len(batch_sizes), 3) if batch_sizes else None,
        "batched_share": round(sum(b > 1 for b in batch_sizes) / len(batch_sizes), 3)
        if batch_sizes
        else None,
        "cold_starts": sum(s.cold_start for s in good),
        "failures": failure_counts(samples),
        "failure_examples": failure_examples(samples),
    }
