"""Small statistics helpers for the benchmark reports."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], pct: float) -> float:
    """The `pct` percentile (0-100) by the nearest-rank method; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


def latency_summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99 and max of latencies given in seconds, in milliseconds."""
    return {
        "p50_ms": round(percentile(seconds, 50) * 1000, 2),
        "p90_ms": round(percentile(seconds, 90) * 1000, 2),
        "p99_ms": round(percentile(seconds, 99) * 1000, 2),
        "max_ms": round(max(seconds, default=0.0) * 1000, 2),
    }
