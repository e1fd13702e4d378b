"""The bounded priority queue of jobs waiting for a worker.

Order: higher priority first, FIFO within a priority, and waiting raises a job's effective
priority by one level every `aging_s` seconds so nothing starves. Because every job ages at the
same rate, comparing `priority + (now - enqueued) / aging_s` between two jobs does not depend on
`now`: the heap key `enqueued / aging_s - priority` is fixed at push time and the heap stays valid.

Jobs of a named tenant use their fair-share start tag (`JobRecord.start_s`, see tenants.py)
where the others use the enqueue time, and with `aging_s` 0 the tag orders a priority's jobs:
tenants that wait at the same priority interleave by weight, each tenant's own jobs stay FIFO.
Jobs of the tenant "" (auth off) rank exactly as before tenants existed.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator

from omnirt.controller.core.jobs import JobRecord
from omnirt.errors import QueueFull

# A heap entry: (rank, fair-share start tag or 0.0, push sequence, job id).
Entry = tuple[float, float, int, str]


class JobQueue:
    """Priority queue with aging, a size bound, lazy removal and an index of batchable jobs."""

    def __init__(self, max_size: int, aging_s: float = 0.0) -> None:
        self.max_size = max_size
        self.aging_s = aging_s
        self._heap: list[Entry] = []
        self._live: dict[str, JobRecord] = {}
        # job id -> its current heap entry (rank, fair-share tag, sequence, job id)
        self._entries: dict[str, Entry] = {}
        # batch key -> queued jobs with that key, and a heap of them in queue order
        self._by_key: dict[Hashable, dict[str, JobRecord]] = {}
        self._key_heaps: dict[Hashable, list[Entry]] = {}
        self._keys: dict[str, Hashable] = {}
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._live

    def check_room(self) -> None:
        """Raise QueueFull (with a retry hint) when one more job would pass the bound."""
        if len(self._live) >= self.max_size:
            raise QueueFull(f"queue is full ({self.max_size} jobs waiting); retry later", retry_after_s=1.0)

    def _entry(self, record: JobRecord) -> Entry:
        # A named tenant's job ranks by its start tag; with no aging the tag is the tie-break
        # within a priority. The tenant "" has no tag (0.0): the push sequence orders it, as before.
        fair = record.start_s if record.job.tenant else 0.0
        waited_from = fair or record.first_enqueued_at
        aging = waited_from / self.aging_s if self.aging_s > 0 else 0.0
        return (aging - record.job.priority, fair, next(self._counter), record.job.id)

    def push(self, record: JobRecord, batch_key: Hashable | None = None) -> None:
        """Queue a job; `batch_key` files it with the jobs it may share a pipeline call with."""
        self.check_room()
        job_id = record.job.id
        self._live[job_id] = record
        entry = self._entry(record)
        self._entries[job_id] = entry
        heapq.heappush(self._heap, entry)
        if batch_key is not None:
            self._by_key.setdefault(batch_key, {})[job_id] = record
            heapq.heappush(self._key_heaps.setdefault(batch_key, []), entry)
            self._keys[job_id] = batch_key

    def remove(self, job_id: str) -> JobRecord | None:
        record = self._live.pop(job_id, None)
        self._entries.pop(job_id, None)
        key = self._keys.pop(job_id, None)
        if key is not None:
            peers = self._by_key[key]
            peers.pop(job_id, None)
            if not peers:
                del self._by_key[key]
                del self._key_heaps[key]
        return record

    def batchable(self, job_id: str) -> bool:
        """True when `job_id` was queued with a batch key (it may share a pipeline call)."""
        return job_id in self._keys

    def count_peers(self, job_id: str) -> int:
        """How many other queued jobs could share a pipeline call with `job_id`."""
        key = self._keys.get(job_id)
        return len(self._by_key[key]) - 1 if key is not None else 0

    def take_peers(self, job_id: str, limit: int) -> list[JobRecord]:
        """Remove and return up to `limit` jobs that can share `job_id`'s call, in queue order."""
        key = self._keys.get(job_id)
        peers: list[JobRecord] = []
        heap = self._key_heaps.get(key) if key is not None else None
        while heap and len(peers) < limit:
            other = heapq.heappop(heap)[-1]
            record = self._by_key[key].get(other)
            if record is None or other == job_id:
                continue  # stale (already gone), or the job itself, which the caller removes
            peers.append(record)
        for record in peers:
            self.remove(record.job.id)
        return peers

    def records(self) -> Iterator[JobRecord]:
        """Live records in dispatch order (sorts a copy: for inspection, not the hot path)."""
        for *_, job_id in sorted(self._heap):
            record = self._live.get(job_id)
            if record is not None:
                yield record

    def position(self, job_id: str) -> int:
        """How many queued jobs are ahead of this one (one pass, no sort)."""
        mine = self._entries.get(job_id)
        if mine is None:
            return 0
        return sum(1 for entry in self._entries.values() if entry < mine)

    def take(self, place: Callable[[JobRecord], bool], budget: int) -> int:
        """Pop jobs in order and offer each to `place` until `budget` calls were placed.

        `place` returns True when it dispatched the job (it removes the job, and any batch peers
        it took along, with `remove`); jobs it refuses keep their position.
        """
        placed = 0
        refused: list[Entry] = []
        while self._heap and placed < budget:
            entry = heapq.heappop(self._heap)
            job_id = entry[-1]
            record = self._live.get(job_id)
            if record is None or self._entries.get(job_id) != entry:
                continue  # removed earlier (cancelled, expired, taken along in a batch) or requeued
            if place(record):
                self.remove(job_id)
                placed += 1
            else:
                refused.append(entry)
        for entry in refused:
            heapq.heappush(self._heap, entry)
        return placed
