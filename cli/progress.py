"""Following a job to its end, with a progress bar on stderr when a person is watching."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from omnirt.client import Client
from omnirt.errors import OmniRTError
from omnirt.types import EventKind, GenerateResult, Job, JobEvent, JobState


class ProgressBar:
    """A rich progress bar of a job's steps on stderr; does nothing when disabled."""

    def __init__(self, job: Job, *, enabled: bool) -> None:
        self.label = job.model or job.id
        self.bar: Any = None
        self.task_id: Any = None
        self.queued = job.state is JobState.QUEUED  # while it is, `waiting` says why
        if not enabled:
            return
        # rich loads only when a bar is shown: scripts and --json never pay for it.
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        total = job.progress.total_steps if job.progress and job.progress.total_steps else None
        self.task_id = self.bar.add_task(self._describe(queued_text(job)), total=total)

    def _describe(self, status: str) -> str:
        return f"{self.label} · {status}"

    def __enter__(self) -> ProgressBar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()

    def on_event(self, event: JobEvent) -> None:
        """Update the bar from one job event."""
        if self.bar is None:
            return
        if event.kind is EventKind.STATE and event.state is not None:
            self.queued = event.state is JobState.QUEUED
            where = f" on {event.worker_id}" if event.worker_id and event.state is JobState.RUNNING else ""
            self.bar.update(self.task_id, description=self._describe(event.state.value + where))
        elif event.kind is EventKind.PROGRESS and event.progress is not None:
            p = event.progress
            fields: dict[str, Any] = {"completed": p.step}
            if p.total_steps:
                fields["total"] = p.total_steps
            if p.stage:
                fields["description"] = self._describe(p.stage)
            self.bar.update(self.task_id, **fields)
        elif event.kind is EventKind.STAGE and not event.stage_finished:
            self.bar.update(self.task_id, description=self._describe(event.stage))

    def waiting(self, job: Job) -> None:
        """Show why a queued job waits (from a fresh `get_job`)."""
        if self.bar is not None and self.queued and job.state is JobState.QUEUED:
            self.bar.update(self.task_id, description=self._describe(queued_text(job)))


def queued_text(job: Job) -> str:
    """`queued · 2 ahead · no connected worker serves model sdxl ...` (the state alone otherwise)."""
    if job.state is not JobState.QUEUED:
        return job.state.value
    parts = ["queued"]
    if job.queue_position:
        parts.append(f"{job.queue_position} ahead")
    if job.waiting_reason:
        parts.append(job.waiting_reason)
    return " · ".join(parts)


class WaitingPoll:
    """While the job is queued and a person watches, ask for it every `every_s` seconds (in a
    thread of its own) and show why it waits: the event stream says when it starts, not why it
    has not."""

    def __init__(self, client: Client, job_id: str, progress: ProgressBar, every_s: float = 1.0) -> None:
        self.client, self.job_id, self.progress, self.every_s = client, job_id, progress, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omnirtctl-waiting", daemon=True)

    def __enter__(self) -> WaitingPoll:
        if self.progress.bar is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _run(self) -> None:
        delay = self.every_s / 2  # a job that starts at once never costs a call
        while not self._stop.wait(delay) and self.progress.queued:
            delay = self.every_s
            try:
                self.progress.waiting(self.client.get_job(self.job_id))
            except OmniRTError:  # the wait itself reports what went wrong
                return


def show_progress(json_output: bool) -> bool:
    """A bar only for people: not with --json, and not when stderr is not a terminal."""
    return not json_output and sys.stderr.isatty()


@dataclass
class Finished:
    """A job that reached its end: its result, the files written and how long we waited."""

    result: GenerateResult
    files: list[Path]
    elapsed_s: float


def follow(
    client: Client,
    job: Job,
    *,
    out: Path,
    timeout: float | None,
    bar: bool,
    started: float | None = None,
) -> Finished:
    """Wait for `job` (raising its typed error) and write its artifacts into `out`.

    `timeout` (s) bounds the wait; `started` is when the caller's clock started (for the
    report's total)."""
    started = time.monotonic() if started is None else started
    with ProgressBar(job, enabled=bar) as progress, WaitingPoll(client, job.id, progress):
        result = client.wait(job.id, timeout, on_event=progress.on_event)
    elapsed = time.monotonic() - started
    return Finished(result=result, files=client.save(result, out), elapsed_s=elapsed)
