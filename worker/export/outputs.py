"""A pipeline call's outputs -> each job's artifacts, every output encoding at once.

Encoding is the last thing between a finished call and its results. The first output encodes
in the pipeline's thread (a single image costs no thread hop); the others go to shared export
threads, as many as CPUs: Pillow's encoders, zlib and x264 release the GIL, so a batch's images
encode side by side (8 photos of 512x512 as PNG: 118 ms one after the other, 63 ms on 2 cores).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from omnirt import types as t
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import ItemPlan

R = TypeVar("R")

# Per job: its artifacts, or the exception that failed its export.
Exported = list[tuple[ItemPlan, list[t.Artifact] | Exception]]


class StageRecorder(Protocol):
    """Where the `export` stage's events and timings go (the run's `modes.events.RunRecorder`)."""

    def stage_started(self, job_ids: list[str], name: str) -> None:
        """Stage `name` began for `job_ids`."""

    def stage_finished(self, job_ids: list[str], name: str, start: float, end: float | None = None) -> None:
        """Stage `name` (begun at perf_counter `start`) ended at `end` (default now)."""


_threads: ThreadPoolExecutor | None = None
_threads_lock = threading.Lock()


def _cpus() -> int:
    """The CPUs this process may run on (its affinity mask on Linux, e.g. a pinned container)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _export_threads() -> ThreadPoolExecutor:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(_cpus(), thread_name_prefix="omnirt-export")
        return _threads


def _outcome(call: Callable[[], R]) -> R | Exception:
    try:
        return call()
    except Exception as exc:
        return exc


def in_parallel(calls: Sequence[Callable[[], R]]) -> list[R | Exception]:
    """Each call's result, or the exception it raised, in order: the first here, the rest at once
    on the export threads."""
    if len(calls) <= 1:
        return [_outcome(call) for call in calls]
    futures = [_export_threads().submit(_outcome, call) for call in calls[1:]]
    return [_outcome(calls[0]), *(future.result() for future in futures)]


def export_outputs(done: list[tuple[ItemPlan, list[Any]]], recorder: StageRecorder) -> Exported:
    """The artifacts of each job of `done` (its plan and its images or videos), encoded at once.

    Records every job's `export` stage, from the start to the end of the whole batch's export
    (its results leave together); a job whose export failed gets the exception instead.
    """
    if not done:
        return []
    started = time.perf_counter()
    recorder.stage_started([plan.job_id for plan, _ in done], "export")
    calls = [
        functools.partial(
            task_pipelines.output_artifact,
            output,
            task=plan.task,
            index=i,
            seed=plan.seeds[i],
            job_id=plan.job_id,
            fmt=plan.output_format,
            quality=plan.item.request.quality,
            fps=plan.fps,
        )
        for plan, outputs in done
        for i, output in enumerate(outputs)
    ]
    encoded = in_parallel(calls)
    ended = time.perf_counter()
    exported: Exported = []
    at = 0
    for plan, outputs in done:
        mine = encoded[at : at + len(outputs)]
        at += len(outputs)
        failure = next((r for r in mine if isinstance(r, Exception)), None)
        if failure is None:
            recorder.stage_finished([plan.job_id], "export", started, ended)
            exported.append((plan, [r for r in mine if not isinstance(r, Exception)]))
        else:
            exported.append((plan, failure))
    return exported
