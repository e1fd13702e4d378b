"""The Redis engine's waiters: a read that a write in flight will answer is not made.

A `Generate` waiting here on a job whose result this controller is storing is woken by FINISH's
notification, which may come before FINISH's own reply: its read of the job then waits for that
reply (which holds the job) instead of reading the job from Redis a second time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from omnirt.controller.engines.redis.waiters import Waiters

KEY = ("job", "job-1")


def counted_read() -> tuple[list[int], Callable[[], Awaitable[str]]]:
    """A read of the job from Redis, and the list of the times it ran."""
    reads: list[int] = []

    async def read() -> str:
        reads.append(1)
        return "read from Redis"

    return reads, read


def test_a_read_a_write_will_answer_waits_for_the_answer_instead_of_reading() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        reads, read = counted_read()

        with waiters.waiting("job-1", run_events=False):
            waiters.expect(KEY, "job-1")  # FINISH is on its way
            waiters.notify("job-1")  # its notification came first
            woken = asyncio.ensure_future(waiters.shared(KEY, read))
            await asyncio.sleep(0)
            assert not woken.done() and not reads, "it waits for FINISH's reply"
            waiters.answer(KEY, "job-1", "FINISH's answer")
            assert await woken == "FINISH's answer" and not reads
            assert await waiters.shared(KEY, read) == "FINISH's answer" and not reads, "a later look too"
        assert not waiters._reads and not waiters._expected, "gone with the job's last waiter"

    asyncio.run(scenario())


def test_a_write_that_gives_no_answer_lets_each_waiter_read() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        reads, read = counted_read()

        with waiters.waiting("job-1", run_events=False):
            waiters.expect(KEY, "job-1")
            woken = asyncio.ensure_future(waiters.shared(KEY, read))
            await asyncio.sleep(0)
            waiters.unexpect(KEY)  # FINISH found the job changed (or expired): no answer
            assert await woken == "read from Redis" and reads == [1]

    asyncio.run(scenario())


def test_nothing_is_expected_for_a_job_nobody_waits_on() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        waiters.expect(KEY, "job-1")
        waiters.answer(KEY, "job-1", "FINISH's answer")
        waiters.unexpect(KEY)
        assert not waiters._reads and not waiters._expected

    asyncio.run(scenario())
