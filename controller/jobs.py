"""The job store: jobs, their event logs, and waiting for new events (in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from omnirt.errors import JobNotFound
from omnirt.types import EventKind, GenerateResult, Job, JobError, JobEvent, JobState

from .validation import Plan


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class JobRecord:
    """A job with what the controller needs to run it: the plan, the event log, the full result."""

    job: Job
    plan: Plan
    fingerprint: bytes = b""
    events: list[JobEvent] = field(default_factory=list)
    # The result with every artifact's bytes; `job.result` is the same minus oversized bytes.
    result: GenerateResult | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    # Kept across requeues, so a retried job keeps its place (and its aging).
    first_enqueued_at: float = field(default_factory=time.monotonic)
    assignment_id: str = ""
    finished_at_monotonic: float = 0.0
    # Made only when someone waits (most jobs have no watcher: the hot path skips the churn).
    _changed: asyncio.Event | None = None
    _final: asyncio.Event | None = None

    @property
    def state(self) -> JobState:
        return self.job.state

    def append(self, event: JobEvent) -> JobEvent:
        """Number the event, log it and wake the watchers."""
        event.sequence = len(self.events) + 1
        event.job_id = self.job.id
        event.time = event.time or utcnow()
        self.events.append(event)
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self._final is not None and self.job.state.terminal:
            self._final.set()
        return event

    async def wait_after(self, sequence: int, timeout: float | None = None) -> list[JobEvent]:
        """Events after `sequence`, waiting for at least one unless the job is already final."""
        if len(self.events) <= sequence and not self.job.state.terminal:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
        return self.events[sequence:]

    async def wait_final(self) -> None:
        """Until the job is in a final state (woken once, not on every progress event)."""
        if self.job.state.terminal:
            return
        if self._final is None:
            self._final = asyncio.Event()
        await self._final.wait()


class JobStore:
    """In-memory jobs, newest last; finished jobs are evicted by count and age."""

    def __init__(self, max_finished: int = 10000, ttl_s: float = 3600.0) -> None:
        self._jobs: OrderedDict[str, JobRecord] = OrderedDict()
        self._by_key: dict[str, str] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()
        self.max_finished = max_finished
        self.ttl_s = ttl_s

    def add(self, record: JobRecord) -> None:
        self._jobs[record.job.id] = record
        if record.job.idempotency_key:
            self._by_key[record.job.idempotency_key] = record.job.id

    def get(self, job_id: str) -> JobRecord:
        record = self._jobs.get(job_id)
        if record is None:
            raise JobNotFound(f"job {job_id!r} not found (unknown or expired)", field="job_id")
        return record

    def by_idempotency_key(self, key: str) -> JobRecord | None:
        job_id = self._by_key.get(key)
        return self._jobs.get(job_id) if job_id else None

    def list(self, states: Iterable[JobState] = (), model: str = "") -> list[JobRecord]:
        """Jobs newest first, filtered by state and model."""
        wanted = set(states)
        return [
            r
            for r in reversed(self._jobs.values())
            if (not wanted or r.job.state in wanted) and (not model or r.job.model == model)
        ]

    def finish(
        self,
        record: JobRecord,
        state: JobState,
        *,
        error: JobError | None = None,
    ) -> None:
        """Move a job to a final state and log the closing events (result, then the state).

        For SUCCEEDED the caller sets `record.result` and `job.result` first.
        """
        job = record.job
        job.state = state
        job.finished_at = utcnow()
        job.error = error
        job.waiting_reason = ""
        job.queue_position = 0
        if state is JobState.SUCCEEDED and job.result is not None:
            record.append(JobEvent(job_id=job.id, kind=EventKind.RESULT, result=job.result))
        record.append(
            JobEvent(job_id=job.id, kind=EventKind.STATE, state=state, error=error, worker_id=job.worker_id)
        )
        record.finished_at_monotonic = time.monotonic()
        self._finished[job.id] = record.finished_at_monotonic
        self.evict()

    def evict(self, now: float | None = None) -> int:
        """Drop finished jobs past the TTL or beyond the count bound; returns how many."""
        now = time.monotonic() if now is None else now
        dropped = 0
        while self._finished:
            job_id, finished = next(iter(self._finished.items()))
            if len(self._finished) <= self.max_finished and now - finished < self.ttl_s:
                break
            self._finished.pop(job_id)
            record = self._jobs.pop(job_id, None)
            if record and record.job.idempotency_key:
                self._by_key.pop(record.job.idempotency_key, None)
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._jobs)
