"""A job record: the job, its plan, its event log, and waiting for new events (in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from omnirt.controller.core.validation import Plan
from omnirt.types import GenerateResult, Job, JobEvent, JobState
from omnirt.v1 import types_pb2


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
    # The client's view of the result as the worker sent it, when it is that (kept for freezing).
    result_message: types_pb2.GenerateResult | None = None
    enqueued_at: float = field(default_factory=time.monotonic)
    # Kept across requeues, so a retried job keeps its place (and its aging).
    first_enqueued_at: float = field(default_factory=time.monotonic)
    # Fair share's start tag (monotonic s, see tenants.py); 0 for the tenant "" (FIFO as before).
    start_s: float = 0.0
    assignment_id: str = ""
    # When the current attempt was sent to a worker (monotonic) and with how many jobs in all:
    # the run-time estimate fair share charges learns from it.
    dispatched_at: float = 0.0
    batch_size: int = 1
    finished_at_monotonic: float = 0.0
    # Made only when someone waits (most jobs have no watcher: the hot path skips the churn).
    _changed: asyncio.Event | None = None
    _final: asyncio.Event | None = None

    # The names a `finished.FinishedJob` has too: the store filters and evicts either kind.
    @property
    def state(self) -> JobState:
        return self.job.state

    @property
    def model(self) -> str:
        return self.job.model

    @property
    def tenant(self) -> str:
        return self.job.tenant

    @property
    def idempotency_key(self) -> str:
        return self.job.idempotency_key

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
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns normally when the
            # caller is cancelled in the loop turn the event is set, so a client that went away
            # (its call cancelled) would go on being served, and its job never abandoned.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await changed.wait()
        return self.events[sequence:]

    async def wait_final(self) -> None:
        """Until the job is in a final state (woken once, not on every progress event)."""
        if self.job.state.terminal:
            return
        if self._final is None:
            self._final = asyncio.Event()
        await self._final.wait()
