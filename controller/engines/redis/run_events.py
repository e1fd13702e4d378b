"""The events of running jobs on their way to Redis, gathered for a moment and written together.

A worker sends a job's events one by one (its RUNNING state, each stage's start and end, each
step's progress), and a fast job sends them all within a few milliseconds of its result. Written
one script each they were most of the Redis work of a short job. Here they wait up to `FLUSH_S`
and go in one APPEND_MANY script for every job that has some; those of a job whose result comes
meanwhile go in its FINISH script instead. Watchers see them that much later: events are live
information, and 20 ms is below what a person notices.

Order holds: a job's events keep their order in its list, a flush is awaited before the next
one starts, and a result waits for the flush in flight (`settled`) before its FINISH, so its
events never land after its final state (where APPEND_MANY would drop them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis.exceptions

from omnirt.controller.engines.redis.records import RunEvents
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.types import JobEvent, Progress

log = logging.getLogger("omnirt.controller")

# How long events wait for company before they are written.
FLUSH_S = 0.02


class RunEventBuffer:
    """Per running job, the events not yet written; one flush task at a time."""

    def __init__(
        self, store: RedisJobStore, written: Callable[[list[str]], None], lost: Callable[[], None]
    ) -> None:
        self.store = store
        self._written = written  # told the jobs whose events were logged (to wake watchers)
        self._lost = lost  # told when Redis was away: the events are dropped (live information)
        self._pending: dict[str, RunEvents] = {}
        self._flush: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None  # done when the write in flight is

    def add(
        self,
        job_id: str,
        assignment_id: str,
        event: JobEvent,
        progress: Progress | None = None,
        worker: str = "",
    ) -> None:
        """Keep `event` of `job_id` under `assignment_id` for the next write."""
        run = self._pending.get(job_id)
        if run is None or run.assignment_id != assignment_id:  # a newer assignment's replace an older's
            run = self._pending[job_id] = RunEvents(job_id, assignment_id)
        run.events.append(event)
        run.progress = progress or run.progress
        run.worker = worker or run.worker
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._write_soon())

    def take(self, job_id: str, assignment_id: str | None = None) -> list[JobEvent]:
        """The events of `job_id` not written yet (under `assignment_id`, when given), which the
        caller writes (in its FINISH); others of the job (an older assignment's) are dropped."""
        run = self._pending.pop(job_id, None)
        if run is None or (assignment_id is not None and run.assignment_id != assignment_id):
            return []
        return run.events

    async def settled(self) -> None:
        """Return once the write in flight, if any, is done (one still gathering is not waited
        for: what the caller took out of it will not be in it)."""
        writing = self._writing
        if writing is not None and not writing.done():
            await asyncio.shield(writing)

    async def _write_soon(self) -> None:
        await asyncio.sleep(FLUSH_S)
        runs, self._pending = list(self._pending.values()), {}
        if not runs:
            return
        self._writing = writing = asyncio.get_running_loop().create_future()
        try:
            await self.store.append_many(runs)
            self._written([r.job_id for r in runs])
        except redis.exceptions.RedisError:
            self._lost()
        except Exception:
            log.exception("writing the events of %d job(s) failed", len(runs))
        finally:
            writing.set_result(None)
            if self._pending:  # what came during the write (add() saw this task running)
                self._flush = asyncio.create_task(self._write_soon())
