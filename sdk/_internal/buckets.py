"""Histogram buckets the controller's and the workers' metrics share, so their series line up."""

from __future__ import annotations

# Seconds: from a 4-step tiny model (tens of ms) to a long video (many minutes).
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
# Jobs per pipeline call.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
