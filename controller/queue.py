"""The bounded priority queue of jobs waiting for a worker."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from omnirt.errors import QueueFull

from .jobs import JobRecord


class JobQueue:
    """Higher priority first, FIFO within a priority; removal is lazy (stale heap entries)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._heap: list[tuple[int, int, str]] = []
        self._live: dict[str, JobRecord] = {}
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._live

    def check_room(self) -> None:
        """Raise QueueFull (with a retry hint) when one more job would pass the bound."""
        if len(self._live) >= self.max_size:
            raise QueueFull(f"queue is full ({self.max_size} jobs waiting); retry later", retry_after_s=1.0)

    def push(self, record: JobRecord) -> None:
        self.check_room()
        self._live[record.job.id] = record
        heapq.heappush(self._heap, (-record.job.priority, next(self._counter), record.job.id))

    def remove(self, job_id: str) -> JobRecord | None:
        return self._live.pop(job_id, None)

    def records(self) -> Iterator[JobRecord]:
        """Live records in dispatch order (sorts a copy: for inspection, not the hot path)."""
        for _, _, job_id in sorted(self._heap):
            record = self._live.get(job_id)
            if record is not None:
                yield record

    def position(self, job_id: str) -> int:
        """How many queued jobs are ahead of this one."""
        for i, record in enumerate(self.records()):
            if record.job.id == job_id:
                return i
        return 0

    def take(self, place: Callable[[JobRecord], bool], budget: int) -> int:
        """Pop jobs in order and offer each to `place` until `budget` jobs were placed.

        Jobs `place` refuses (no worker for them now) keep their position.
        """
        placed = 0
        refused: list[tuple[int, int, str]] = []
        while self._heap and placed < budget:
            entry = heapq.heappop(self._heap)
            record = self._live.get(entry[2])
            if record is None:
                continue
            if place(record):
                del self._live[entry[2]]
                placed += 1
            else:
                refused.append(entry)
        for entry in refused:
            heapq.heappush(self._heap, entry)
        return placed
