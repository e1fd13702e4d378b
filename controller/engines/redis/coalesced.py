"""One script call for the submits (or results) of many concurrent requests: a group commit.

Under load most of a controller's time on Redis went into round trips, each carrying one job:
redis-py's work per command, and Redis's own per read and reply. Here the calls of one script
from concurrent tasks wait while a call of it is in flight and then go together, each job's
arguments one segment of the next call (`many`); every caller gets its own job's answer.
A call with nothing in flight goes at the loop's next turn, so an idle controller waits for
nothing, and a busy one sends as many jobs per round trip as arrived during the last one.

Each job in a call is handled as alone (the script runs the single-job body once per segment,
atomically as a whole): one job's refusal changes nothing for the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

# The most jobs in one call: a call holds Redis for its whole run.
LIMIT = 64


class Coalesced:
    """Calls of one script from concurrent tasks, sent together; one call in flight at a time."""

    def __init__(self, run: Callable[[list[Any]], Awaitable[Sequence[Any]]], limit: int = LIMIT) -> None:
        self._run = run  # runs the script with the segments' arguments; returns the answers in order
        self._limit = limit
        self._pending: list[tuple[list[Any], asyncio.Future[Any]]] = []
        self._task: asyncio.Task[None] | None = None

    async def call(self, *args: Any) -> Any:
        """The script's answer for one job's `args`."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((list(args), future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._flush())
        return await future

    async def close(self, timeout_s: float = 1.0) -> None:
        """Let the call in flight end (up to `timeout_s`, then cancel it), so that no script
        call is left running when the connections close."""
        task = self._task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=timeout_s)

    async def _flush(self) -> None:
        try:
            await asyncio.sleep(0)  # the calls made in this turn of the loop go together
            await self._send_all()
        finally:  # cancelled (the controller stops): no caller is left waiting
            for _, future in self._pending:
                future.cancel()
            self._pending = []

    async def _send_all(self) -> None:
        while self._pending:
            # A caller that went away before its call was sent (a client that left) sends nothing.
            self._pending = [(a, f) for a, f in self._pending if not f.cancelled()]
            batch, self._pending = self._pending[: self._limit], self._pending[self._limit :]
            if not batch:
                return
            args: list[Any] = []
            for job_args, _ in batch:
                args += [len(job_args), *job_args]
            try:
                answers = await self._run(args)
            except BaseException as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception) else asyncio.CancelledError())
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)


def many(body: str, before: str = "", after: str = "") -> str:
    """A script that runs the single-job script `body` once per job: ARGV is p, then per job the
    count of its arguments and those (its ARGV without p). Returns the answers in order
    (the script side of `Coalesced`). `before` and `after` run once, around the jobs."""
    return (
        "local function one(ARGV)\n"
        + body
        + "\nend\n"
        + before
        + r"""
local out, i = {}, 2
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local a = {ARGV[1]}
  for j = i + 1, i + n do a[#a + 1] = ARGV[j] end
  out[#out + 1] = one(a)
  i = i + n + 1
end
"""
        + after
        + "\nreturn out\n"
    )
