"""`Outbox`: messages waiting to go up the controller stream.

Results must reach the controller: one whose write fails is put back at the front and sent
after the next Hello. Events and heartbeats are only useful live: they are dropped while no
stream is up. A run's result waiting here can be found by its job id (`waiting_result`): a job
offered again meanwhile (a restarted controller requeued it) gets this result re-addressed,
not a second run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# A result whose write failed this many times is given up (the controller retries the job
# elsewhere once the lease of this worker's old stream expires).
MAX_RESULT_ATTEMPTS = 5


@dataclass
class OutgoingMessage:
    """One message for the stream; `durable` ones (results) survive reconnects."""

    message: Any
    durable: bool = False
    attempts: int = 0
    job_id: str = ""  # a run's result: findable by `Outbox.waiting_result` until written


class Outbox:
    """A FIFO of outgoing messages with put-back for results that failed to send."""

    def __init__(self) -> None:
        self._items: deque[OutgoingMessage] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        # job id -> its run's result, from put until written or given up (queued or in flight)
        self._results: dict[str, OutgoingMessage] = {}

    def _changed(self) -> None:
        if self._items:
            self._ready.set()
        else:
            self._ready.clear()
        if self._items or self._in_flight:
            self._idle.clear()
        else:
            self._idle.set()

    def put(self, message: Any, *, durable: bool = False, job_id: str = "") -> None:
        """Queue `message` (durable: keep it until it was written; `job_id`: a durable message
        that is the result of that job's run, found by `waiting_result` meanwhile)."""
        item = OutgoingMessage(message, durable or bool(job_id), job_id=job_id)
        self._items.append(item)
        if job_id:
            self._results[job_id] = item
        self._changed()

    def waiting_result(self, job_id: str) -> Any | None:
        """The result of `job_id`'s run while it waits to be written (None once written)."""
        item = self._results.get(job_id)
        return item.message if item is not None else None

    def _settled(self, item: OutgoingMessage) -> None:
        if item.job_id and self._results.get(item.job_id) is item:
            del self._results[item.job_id]

    async def get(self) -> OutgoingMessage:
        """The next message; call `sent` or `failed` with it afterwards."""
        return (await self.get_many(1, 0, len))[0]

    async def get_many(
        self, max_items: int, max_bytes: int, size: Callable[[Any], int]
    ) -> list[OutgoingMessage]:
        """The next message and those queued behind it, up to `max_items` and `max_bytes` in all
        (`size` of each message; the first one is taken whatever its size), in order.

        Call `sent` or `failed` with each afterwards.
        """
        while not self._items:
            await self._ready.wait()
        taken = [self._items.popleft()]
        total = size(taken[0].message) if len(self._items) and max_items > 1 else 0
        while self._items and len(taken) < max_items:
            total += size(self._items[0].message)
            if total > max_bytes:
                break
            taken.append(self._items.popleft())
        self._in_flight += len(taken)
        self._changed()
        return taken

    def sent(self, item: OutgoingMessage) -> None:
        """`item` was written to the stream."""
        self._in_flight -= 1
        self._settled(item)
        self._changed()

    def failed(self, item: OutgoingMessage) -> bool:
        """The write of `item` failed; durable items go back to the front. True when kept.

        For several items of one failed write, call it in reverse order to keep their order.
        """
        self._in_flight -= 1
        item.attempts += 1
        kept = item.durable and item.attempts < MAX_RESULT_ATTEMPTS
        if kept:
            self._items.appendleft(item)
        else:
            self._settled(item)
        self._changed()
        return kept

    def drop_live(self) -> int:
        """Forget events and heartbeats (the stream is down); return how many were dropped."""
        kept = deque(item for item in self._items if item.durable)
        dropped = len(self._items) - len(kept)
        self._items = kept
        self._changed()
        return dropped

    def durable_pending(self) -> int:
        """Results not yet written."""
        return sum(1 for item in self._items if item.durable)

    async def wait_idle(self) -> None:
        """Until everything queued has been written (or dropped)."""
        await self._idle.wait()
