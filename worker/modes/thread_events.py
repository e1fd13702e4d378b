"""`ThreadEvents`: a pipeline thread's events to the event loop, in a few wake-ups per run.

A pipeline thread that handed each event to the loop (`call_soon_threadsafe`) woke the loop
once per event: a dozen times in a 4-step tiny-sd call. Each wake-up makes the loop's thread
take the GIL from the pipeline thread, which then waits while the loop converts and writes
the event. On a small CPU model that cost about 5 ms in a 60 ms call (see
docs/BENCHMARKS.md, "Overhead"); even one wake-up costs the pipeline about 1 ms on a 2-core
machine (measured on one worker, calls alternating between settings: a first-progress wake-up
added 0.8 ms to a 45 ms tiny-sd call; waking every 0.1 s instead of every 1 s added 8 ms,
1.1 %, to a 0.78 s one).

Here the thread only appends to a list, and wakes the loop when `interval` has passed since
the run started or the loop last took the events. Meanwhile the loop takes what is waiting
every `interval` while the run lasts, and everything at its end, before the results. So a
watcher sees every event, in order, with the time it happened, at most `interval` late (by
default 0.25 s: four updates a second); a model whose steps are slower than that gets each
one at once. An interval of 0 sends every event at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from omnirt import types as t
from omnirt.worker.modes.executor import EventSink

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
