"""The tasks of this controller that wait on a job in Redis (Generate's wait, WatchJob), by job id.

A notification wakes them: a change this controller made, or another controller's, which the
upkeep hears through Redis. Waiters also look again every `WAIT_S` without one (a notification
lost while Redis was away), so a wake-up is a hint to read the job, never its state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

# How long a waiter sleeps between checks when no notification comes.
WAIT_S = 1.0


class Waiters:
    """Wake-up events of the tasks waiting on each job."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    def __len__(self) -> int:
        """How many jobs someone waits on."""
        return len(self._events)

    @contextlib.contextmanager
    def waiting(self, job_id: str) -> Iterator[Callable[[], Awaitable[None]]]:
        """Wait on `job_id` for the block: yields `changed()`, which returns at the job's next
        notification since the last call, or after `WAIT_S`."""
        event = asyncio.Event()
        self._events.setdefault(job_id, set()).add(event)

        async def changed() -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAIT_S):  # not wait_for: see core/jobs.py
                    await event.wait()
            event.clear()

        try:
            yield changed
        finally:
            waiting = self._events.get(job_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[job_id]

    def notify(self, job_id: str) -> None:
        """Wake the tasks waiting on `job_id`."""
        for event in self._events.get(job_id, ()):
            event.set()

    def notify_all(self) -> None:
        """Wake every waiter to look again (what it waits for may have come meanwhile)."""
        for job_id in list(self._events):
            self.notify(job_id)
