"""A run's events: `RunRecorder` (events and stage timings of a run), `StepMonitor` (the step
callback, which also makes the live previews of the `preview` runtime option),
`attach_step_hook` (a step's end on pipelines without a step callback), `ThreadEvents` (a
pipeline thread's events to the event loop), and `run_report`, the RunReport of one job built
once for every execution mode: each mode knows its own facts (where it ran, the memory it peaked
at, the configuration it resolved, whether it started cold); everything else a report says (ids,
task, queue wait, stage timings, batch, trace id, timestamps, version) comes from the assignment,
the job's item and the run's `RunRecorder`, the same way in every mode.

Executors call the recorder from the pipeline thread; the sink it is given must be thread-safe
(the executors hand it a `ThreadEvents`, which passes the events to the daemon's sink on the
loop). Offsets and durations are wall time in milliseconds from the start of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import omnirt
from omnirt import types as t
from omnirt._internal.protocol.messages import Assignment, AssignmentItem
from omnirt.worker.failures import StopRun
from omnirt.worker.modes.executor import EventSink, StopCheck
from omnirt.worker.pipelines.previews import PreviewMaker


class RunRecorder:
    """Emits STATE / STAGE / PROGRESS events and keeps `StageTiming`s per job."""

    def __init__(self, emit: EventSink) -> None:
        self._emit = emit
        self.started = time.perf_counter()
        self.started_at = datetime.now(UTC)
        self.timings: dict[str, list[t.StageTiming]] = {}

    def elapsed_ms(self, since: float | None = None) -> float:
        """Milliseconds from `since` (a perf_counter value; default the run's start) to now."""
        return (time.perf_counter() - (self.started if since is None else since)) * 1000.0

    def offset_ms(self, at: float) -> float:
        """Milliseconds from the run's start to `at` (a perf_counter value)."""
        return (at - self.started) * 1000.0

    def _event(self, job_id: str, kind: t.EventKind, **fields: Any) -> None:
        """One event of `job_id`: `fields` are the `JobEvent` fields of its kind."""
        self._emit(t.JobEvent(job_id=job_id, kind=kind, time=datetime.now(UTC), **fields))

    def running(self, job_id: str, worker_id: str, attempt: int) -> None:
        """The job started on this worker."""
        self._event(job_id, t.EventKind.STATE, state=t.JobState.RUNNING, worker_id=worker_id, attempt=attempt)

    def stage_started(self, job_ids: list[str], name: str) -> None:
        """Stage `name` began for `job_ids`."""
        for job_id in job_ids:
            self._event(job_id, t.EventKind.STAGE, stage=name, stage_finished=False)

    def stage_finished(self, job_ids: list[str], name: str, start: float, end: float | None = None) -> None:
        """Stage `name` (begun at perf_counter `start`) ended at `end` (default now): event + timing."""
        end = time.perf_counter() if end is None else end
        duration = (end - start) * 1000.0
        for job_id in job_ids:
            self._event(
                job_id, t.EventKind.STAGE, stage=name, stage_finished=True, stage_duration_ms=duration
            )
            self.timings.setdefault(job_id, []).append(t.StageTiming(name, duration, self.offset_ms(start)))

    def progress(self, job_ids: list[str], step: int, total_steps: int, stage: str = "denoise") -> None:
        """Step `step` of `total_steps` is done."""
        progress = t.Progress(step=step, total_steps=total_steps, stage=stage)
        for job_id in job_ids:
            self._event(job_id, t.EventKind.PROGRESS, progress=progress)

    def note(self, job_ids: list[str], text: str) -> None:
        """A line of the runtime's own about `job_ids` (a LOG event on the `omnirt` stream)."""
        for job_id in job_ids:
            self._event(job_id, t.EventKind.LOG, log_stream="omnirt", log_text=text)

    def preview(self, job_id: str, step: int, total_steps: int, data: bytes, mime_type: str) -> None:
        """A preview image of `job_id` after step `step`."""
        progress = t.Progress(step=step, total_steps=total_steps, stage="denoise")
        self._event(job_id, t.EventKind.PREVIEW, progress=progress, preview=data, preview_mime_type=mime_type)


class StepMonitor:
    """A diffusers `callback_on_step_end`: progress per step, stop checks, the denoise/decode split.

    `denoise` runs from `started_at` to the last step callback, `decode` from there to the
    call's return (`finish`). Raises StopRun at a step end once every job must stop.

    With `previews`, every job whose first output is at `outputs[i]` of the call's batch gets
    a PREVIEW event at the steps `previews.due` names, made from the step's `latents`.
    """

    def __init__(
        self,
        recorder: RunRecorder,
        stop: StopCheck,
        job_ids: list[str],
        planned_steps: int,
        previews: PreviewMaker | None = None,
        outputs: list[int] | None = None,
    ) -> None:
        self.recorder = recorder
        self.previews = previews
        self.outputs = outputs if outputs is not None else list(range(len(job_ids)))
        self.stop = stop
        self.job_ids = job_ids
        self.total_steps = planned_steps
        self.started_at = time.perf_counter()
        self.last_step_at: float | None = None
        self.denoise_closed = False

    def start(self) -> None:
        """The pipeline call begins (denoise, text encoding included, starts now)."""
        self.started_at = time.perf_counter()
        self.recorder.stage_started(self.job_ids, "denoise")

    def __call__(
        self, pipe: Any, step_index: int, timestep: Any, callback_kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        now = time.perf_counter()
        self.last_step_at = now
        # The real number of denoising steps (some schedulers run more than asked for).
        total = getattr(pipe, "num_timesteps", None) or self.total_steps or step_index + 1
        self.total_steps = int(total)
        step = step_index + 1
        self.recorder.progress(self.job_ids, step, self.total_steps)
        if self.stop.all_stopped(self.job_ids):
            raise StopRun()
        if self.previews is not None and self.previews.due(step, self.total_steps):
            latents = callback_kwargs.get("latents")
            send_previews(
                self.recorder,
                self.stop,
                self.previews,
                pipe,
                latents,
                step,
                self.total_steps,
                self.job_ids,
                self.outputs,
            )
        if step >= self.total_steps:
            self._close_denoise(now)
        return callback_kwargs

    def _close_denoise(self, at: float) -> None:
        self.denoise_closed = True
        self.recorder.stage_finished(self.job_ids, "denoise", self.started_at, at)
        self.recorder.stage_started(self.job_ids, "decode")

    def finish(self, returned: float | None = None) -> None:
        """The call returned: close denoise (if the callback never saw the last step) and decode."""
        returned = time.perf_counter() if returned is None else returned
        if not self.denoise_closed:
            self._close_denoise(self.last_step_at or returned)
        self.recorder.stage_finished(self.job_ids, "decode", self.last_step_at or returned, returned)


def send_previews(
    recorder: RunRecorder,
    stop: StopCheck,
    previews: PreviewMaker,
    pipe: Any,
    latents: Any,
    step: int,
    total_steps: int,
    job_ids: list[str],
    outputs: list[int],
) -> None:
    """A PREVIEW event for each job still running, of its first output (`outputs[i]` in the
    call's batch of `latents`) after step `step`.

    In the pipeline thread, between steps: the loop waits for the projection and the encode
    only; the event is queued (ThreadEvents), never sent from here.
    """
    made = previews.make(pipe, latents, outputs)
    for job_id, preview in zip(job_ids, made, strict=True):
        if preview is not None and not stop.reason(job_id):
            recorder.preview(job_id, step, total_steps, preview.data, preview.mime_type)


def first_outputs(num_outputs: list[int]) -> list[int]:
    """Where each job's first output sits in a call's batch, from the jobs' output counts."""
    return [sum(num_outputs[:i]) for i in range(len(num_outputs))]


# ---- ThreadEvents: a pipeline thread's events to the loop ----------------------------------------
#
# A pipeline thread that handed each event to the loop (`call_soon_threadsafe`) woke the loop
# once per event: a dozen times in a 4-step tiny-sd call. Each wake-up makes the loop's thread
# take the GIL from the pipeline thread, which then waits while the loop converts and writes
# the event. On a small CPU model that cost about 5 ms in a 60 ms call (see
# docs/BENCHMARKS.md, "Overhead"); even one wake-up costs the pipeline about 1 ms on a 2-core
# machine (measured on one worker, calls alternating between settings: a first-progress wake-up
# added 0.8 ms to a 45 ms tiny-sd call; waking every 0.1 s instead of every 1 s added 8 ms,
# 1.1 %, to a 0.78 s one).
#
# Here the thread only appends to a list, and wakes the loop when `interval` has passed since
# the run started or the loop last took the events. Meanwhile the loop takes what is waiting
# every `interval` while the run lasts, and everything at its end, before the results. So a
# watcher sees every event, in order, with the time it happened, at most `interval` late (by
# default 0.25 s: four updates a second); a model whose steps are slower than that gets each
# one at once. An interval of 0 sends every event at once.

INTERVAL_S = 0.25

R = TypeVar("R")


class ThreadEvents:
    """Collects events from one run's threads and hands them to `emit` on `loop`."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, emit: EventSink, interval: float = INTERVAL_S
    ) -> None:
        self._loop = loop
        self._emit = emit
        self._interval = interval
        self._lock = threading.Lock()
        self._waiting: list[t.JobEvent] = []
        self._wake_pending = False
        # The run's first events (its stages starting) wait like the others: the controller
        # knows the job runs.
        self._last_taken = time.monotonic()
        self._closed = False  # the run is over: events that still come go to the loop one by one

    def __call__(self, event: t.JobEvent) -> None:
        """The sink the pipeline thread calls: keep `event`; wake the loop once `interval` passed."""
        with self._lock:
            self._waiting.append(event)
            urgent = self._closed or time.monotonic() - self._last_taken >= self._interval
            if self._wake_pending or not urgent:
                return
            self._wake_pending = True
        # The loop is gone when the worker stops mid-run: the event has nowhere to go then.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.take)

    def take(self) -> None:
        """On the loop: emit every waiting event, in order."""
        with self._lock:
            events, self._waiting = self._waiting, []
            self._wake_pending = False
            self._last_taken = time.monotonic()
        for event in events:
            self._emit(event)

    async def run(self, fn: Callable[..., R], *args: object) -> R:
        """`fn(*args)` in a thread (`asyncio.to_thread`), taking events every `interval` meanwhile
        and all of them when it ends (also when it fails or this coroutine is cancelled)."""
        call = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        try:
            while True:
                # Interval 0: every event wakes the loop itself, so there is nothing to poll for.
                done, _ = await asyncio.wait({call}, timeout=self._interval or None)
                if done:
                    return call.result()
                self.take()
        finally:
            call.cancel()  # as `await asyncio.to_thread(...)` would: the thread itself runs on
            with self._lock:
                self._closed = True
            self.take()


# ---- a step hook on pipelines without a step callback ------------------------------------------
#
# Diffusers pipelines end a step in one of three ways: `callback_on_step_end` (most), the older
# `callback(step, timestep, latents)` (Stable Audio), or neither (HunyuanVideo 1.5: the loop only
# updates its progress bar). For the last, the call's own copy of the pipeline gets a
# `progress_bar` whose `update()` is the step's end: the loop calls it once per step, after the
# scheduler step, exactly where `callback_on_step_end` would run. The hook may raise to stop the
# call (cancel, deadline) there too.

StepHook = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]
"""A diffusers `callback_on_step_end`: (pipeline, step index, timestep, tensors) -> tensors."""


def attach_step_hook(view: Any, accepted: frozenset[str], kwargs: dict[str, Any], hook: StepHook) -> str:
    """Wire `hook` into the call of `view` (a per-call copy of the pipeline) with `kwargs`;
    returns which way: `callback_on_step_end`, `callback` or `progress_bar`."""
    if "callback_on_step_end" in accepted:
        kwargs["callback_on_step_end"] = hook
        return "callback_on_step_end"
    if "callback" in accepted:
        kwargs["callback"] = lambda step, timestep, _latents: hook(view, step, timestep, {})
        return "callback"
    # An instance attribute shadows DiffusionPipeline.progress_bar for this copy only.
    object.__setattr__(view, "progress_bar", _StepBars(view, hook))
    return "progress_bar"


class _StepBars:
    """Stands in for `pipeline.progress_bar(iterable=None, total=None)`."""

    def __init__(self, view: Any, hook: StepHook) -> None:
        self.view = view
        self.hook = hook
        self.steps = 0

    def __call__(self, iterable: Iterable[Any] | None = None, total: int | None = None) -> Any:
        if iterable is not None:
            return _steps_of(iterable, self)
        return _StepBar(self)

    def step_done(self) -> None:
        self.steps += 1
        self.hook(self.view, self.steps - 1, None, {})


class _StepBar:
    """`with pipeline.progress_bar(total=n) as bar: ... bar.update()`: each update ends a step."""

    def __init__(self, bars: _StepBars) -> None:
        self.bars = bars

    def __enter__(self) -> _StepBar:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        for _ in range(n):
            self.bars.step_done()

    def close(self) -> None:
        return None


def _steps_of(iterable: Iterable[Any], bars: _StepBars) -> Any:
    """`for x in pipeline.progress_bar(items)`: a step ends when the loop asks for the next item
    (or leaves after the last)."""
    for item in iterable:
        yield item
        bars.step_done()


# ---- the RunReport of one job, built once for every execution mode -------------------------------


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
