"""The RunReport of one job, built once for every execution mode.

Each mode knows its own facts (where it ran, the memory it peaked at, the configuration it
resolved, whether it started cold); everything else a report says (ids, task, queue wait,
stage timings, batch, trace id, timestamps, version) comes from the assignment, the job's item
and the run's `RunRecorder`, the same way in every mode.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import omnirt
from omnirt import types as t
from omnirt._internal.protocol.messages import Assignment, AssignmentItem
from omnirt.worker.modes.events import RunRecorder


def trace_id(trace_context: Mapping[str, str]) -> str:
    """The trace id of the assignment's W3C `traceparent` ("" without a well-formed one)."""
    # W3C traceparent: version-traceid-spanid-flags.
    parts = trace_context.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 else ""


def run_report(
    assignment: Assignment,
    item: AssignmentItem,
    recorder: RunRecorder,
    *,
    worker_id: str,
    execution_mode: str,
    backend: str,
    device: str,
    dtype: str = "",
    seeds: Sequence[int],
    peak_memory_bytes: int,
    config_resolved: dict[str, Any],
    cold_start: bool = False,
    pipeline_class: str = "",
    cache_hits: Mapping[str, int] | None = None,
    warnings: Sequence[str] = (),
) -> t.RunReport:
    """The report of `item`'s job, finished now: the mode's facts plus what every mode reports alike."""
    spec = assignment.model
    return t.RunReport(
        run_id=str(uuid.uuid4()),
        job_id=item.job_id,
        worker_id=worker_id,
        model=spec.id,
        task=item.request.task or (spec.tasks[0] if spec.tasks else None),
        backend=backend,
        execution_mode=str(execution_mode),  # a plain str, also when given an ExecutionMode
        device=device,
        dtype=dtype,
        queue_wait_ms=item.queue_wait_ms,
        timings=list(recorder.timings.get(item.job_id, [])),
        execution_ms=recorder.elapsed_ms(),
        peak_memory_bytes=peak_memory_bytes,
        config_resolved=config_resolved,
        cold_start=cold_start,
        attempt=item.attempt,
        batch_size=len(assignment.items),
        batch_group_id=assignment.batch_group_id,
        seeds=list(seeds),
        cache_hits=dict(cache_hits or {}),
        trace_id=trace_id(assignment.trace_context),
        warnings=list(warnings),
        started_at=recorder.started_at,
        finished_at=datetime.now(UTC),
        pipeline_class=pipeline_class,
        omnirt_version=omnirt.__version__,
    )
