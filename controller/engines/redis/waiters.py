"""The tasks of this controller that wait on a job in Redis (Generate's wait, WatchJob), by job id.

A notification wakes them: a change this controller made, or another controller's, which the
upkeep hears through Redis. Waiters also look again every `WAIT_S` without one (a notification
lost while Redis was away), so a wake-up is a hint to read the job, never its state.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Iterator
from typing import Any, TypeVar, cast

T = TypeVar("T")

# How long a waiter sleeps between checks when no notification comes.
WAIT_S = 1.0
# How many jobs notified with nobody waiting are remembered (`Waiters.unheard`).
UNHEARD = 4096


class Waiters:
    """Wake-up events of the tasks waiting on each job, and the reads they share."""

    def __init__(self) -> None:
        # job id -> each waiter's event, and whether new events of the run wake it (watchers) or
        # only a change of state (`wait`)
        self._events: dict[str, dict[asyncio.Event, bool]] = {}
        self._reads: dict[Hashable, asyncio.Future[Any]] = {}
        # Reads answered without reading (`answer`), by job: they go with the job's last waiter.
        self._answered: dict[str, set[Hashable]] = {}
        # Reads a write in flight here will answer (`expect`): their waiters wait for it.
        self._expected: dict[Hashable, asyncio.Future[Any]] = {}
        # The latest jobs notified while nobody here waited on them (oldest first, at most
        # UNHEARD): a wait that starts later must look at such a job at once.
        self._unheard: collections.OrderedDict[str, None] = collections.OrderedDict()

    def __len__(self) -> int:
        """How many jobs someone waits on."""
        return len(self._events)

    @contextlib.contextmanager
    def waiting(self, job_id: str, run_events: bool = True) -> Iterator[Callable[[], Awaitable[bool]]]:
        """Wait on `job_id` for the block: yields `changed()`, which returns at the job's next
        notification since the last call (with `run_events` False, not at those that say only
        that its run has new events), True, or after `WAIT_S`, False."""
        event = asyncio.Event()
        self._events.setdefault(job_id, {})[event] = run_events

        async def changed() -> bool:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WAIT_S):  # not wait_for: see core/jobs.py
                    await event.wait()
            notified = event.is_set()
            event.clear()
            return notified

        try:
            yield changed
        finally:
            waiting = self._events.get(job_id)
            if waiting is not None:
                waiting.pop(event, None)
                if not waiting:
                    del self._events[job_id]
                    for key in self._answered.pop(job_id, ()):
                        self._reads.pop(key, None)
                        self._expected.pop(key, None)

    def notify(self, job_id: str, state: bool = True) -> None:
        """Wake the tasks waiting on `job_id`: all of them, or with `state` False (only new
        events of its run) the watchers alone."""
        waiting = self._events.get(job_id)
        if not waiting:
            if not state:
                return  # new events of its run: not a change a later wait must look for
            self._unheard[job_id] = None
            if len(self._unheard) > UNHEARD:
                self._unheard.popitem(last=False)
            return
        for event, run_events in waiting.items():
            if state or run_events:
                event.set()

    def unheard(self, job_id: str) -> bool:
        """Whether `job_id` was notified lately while nobody here waited on it (or so long ago
        that it is forgotten: then a wait must look too, which `wait` does for any job it did not
        see submitted)."""
        return job_id in self._unheard

    def waits_for(self, job_id: str) -> bool:
        """Whether a `wait` here waits on `job_id` (not only watchers)."""
        return any(not run_events for run_events in self._events.get(job_id, {}).values())

    def answer(self, key: Hashable, job_id: str, value: Any) -> None:
        """The answer of the read `key` of the waiters of `job_id`, known without reading (it came
        back from a write): their `shared(key)` returns it while they wait on the job."""
        pending = self._expected.pop(key, None)
        if pending is not None and not pending.done():
            pending.set_result(value)  # the waiters that came during the write
        if job_id not in self._events:
            return
        future = asyncio.get_running_loop().create_future()
        future.set_result(value)
        self._reads[key] = future
        self._answered.setdefault(job_id, set()).add(key)

    def expect(self, key: Hashable, job_id: str) -> None:
        """A write in flight here will `answer` the read `key` of the waiters of `job_id`: until
        then their `shared(key)` waits for that answer instead of reading (the notification of
        the write may come before its reply). The writer then calls `answer`, or `unexpect` when
        the write gave no answer (the waiters then read, each)."""
        if job_id not in self._events:
            return
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._expected[key] = self._reads[key] = future
        self._answered.setdefault(job_id, set()).add(key)

    def unexpect(self, key: Hashable) -> None:
        """The write `expect` announced gave no answer: its waiters read for themselves."""
        pending = self._expected.pop(key, None)
        if pending is not None:
            if self._reads.get(key) is pending:
                del self._reads[key]
            pending.cancel()

    def notify_run_events(self, job_ids: list[str]) -> None:
        """New events of these jobs' runs were written: wake their watchers."""
        for job_id in job_ids:
            self.notify(job_id, state=False)

    async def shared(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """`read()`'s answer, shared with every caller that asks for the same `key` while it runs:
        a thousand watchers of one job woken together make one read, not a thousand."""
        future = self._reads.get(key)
        if future is None:
            future = self._reads[key] = asyncio.ensure_future(read())

            def done(f: asyncio.Future[Any]) -> None:
                if self._reads.get(key) is f:
                    del self._reads[key]
                if not f.cancelled():
                    f.exception()  # retrieved: every caller may have gone

            future.add_done_callback(done)
        try:
            return cast(T, await asyncio.shield(future))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if (task is not None and task.cancelling()) or not future.cancelled():
                raise  # this caller was cancelled
            return await read()  # the shared read was cancelled, not this caller: read alone

    def notify_all(self) -> None:
        """Wake every waiter to look again (what it waits for may have come meanwhile)."""
        for job_id in list(self._events):
            self.notify(job_id)


def raise_lost_cancel() -> None:
    """Raise CancelledError in a task that was cancelled but goes on running.

    redis-py sends a command under asyncio.wait_for when a socket timeout is set, and on Python
    3.11 wait_for returns normally when the cancellation lands just as the send ends: the
    cancellation is lost, and the task goes on (a Generate whose client left kept waiting for
    its job, which then ran to the end; a stopping controller's upkeep loop went on). The task
    still counts the request (`Task.cancelling()`), so loops around Redis calls check it.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
