"""`RunRecorder` (events and stage timings of a run) and `StepMonitor` (the step callback,
which also makes the live previews of the `preview` runtime option).

Executors call it from the pipeline thread; the sink it is given must be thread-safe (the
executors hand it a `ThreadEvents`, which passes the events to the daemon's sink on the loop).
Offsets and durations are wall time in milliseconds from the start of the run.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from omnirt import types as t
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
