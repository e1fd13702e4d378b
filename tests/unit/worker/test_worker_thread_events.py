"""ThreadEvents: a pipeline thread's events reach the loop complete, in order, and in few wake-ups."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.events import INTERVAL_S, ThreadEvents


def stage(job_id: str, name: str) -> t.JobEvent:
    return t.JobEvent(job_id=job_id, kind=t.EventKind.STAGE, time=datetime.now(UTC), stage=name)


def progress(job_id: str, step: int) -> t.JobEvent:
    return t.JobEvent(
        job_id=job_id,
        kind=t.EventKind.PROGRESS,
        time=datetime.now(UTC),
        progress=t.Progress(step=step, total_steps=100, stage="denoise"),
    )


class Sink:
    """The loop side: records what arrived and in how many separate loop callbacks."""

    def __init__(self) -> None:
        self.events: list[t.JobEvent] = []
        self.thread_ids: set[int] = set()

    def __call__(self, event: t.JobEvent) -> None:
        self.thread_ids.add(threading.get_ident())
        self.events.append(event)


def test_every_event_arrives_in_order_on_the_loop_before_the_run_returns() -> None:
    sink = Sink()

    def pipeline(events: ThreadEvents) -> str:
        events(stage("a", "denoise"))
        for step in range(1, 201):
            events(progress("a", step))
        events(stage("a", "decode"))
        return "images"

    async def main() -> tuple[str, int]:
        events = ThreadEvents(asyncio.get_running_loop(), sink)
        return await events.run(pipeline, events), threading.get_ident()

    result, loop_thread = asyncio.run(main())
    assert result == "images"
    kinds = [e.kind for e in sink.events]
    assert kinds == [t.EventKind.STAGE] + [t.EventKind.PROGRESS] * 200 + [t.EventKind.STAGE]
    assert [e.progress.step for e in sink.events if e.progress] == list(range(1, 201))
    assert sink.thread_ids == {loop_thread}  # the daemon's sink is only ever called on the loop


def test_a_run_shorter_than_the_interval_never_wakes_the_loop_before_it_ends() -> None:
    """Its events (first progress included: it no longer wakes the loop) come with its end."""
    sink = Sink()
    seen_while_running: list[int] = []

    def pipeline(events: ThreadEvents) -> None:
        events(stage("a", "denoise"))
        for step in range(1, 50):
            events(progress("a", step))
        events(progress("b", 1))
        time.sleep(0.2)
        seen_while_running.append(len(sink.events))

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=30.0)
        await events.run(pipeline, events)

    asyncio.run(main())
    assert seen_while_running == [0]
    assert [f"{e.job_id}{e.progress.step if e.progress else ''}" for e in sink.events[:3]] == [
        "a",
        "a1",
        "a2",
    ]
    assert len(sink.events) == 1 + 49 + 1


def test_interval_zero_hands_each_event_over_at_once() -> None:
    sink = Sink()
    arrived: list[bool] = []

    def pipeline(events: ThreadEvents) -> None:
        for step in range(1, 4):
            events(progress("a", step))
            arrived.append(wait_until(lambda: len(sink.events) == step, timeout=5))  # noqa: B023

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=0)
        await events.run(pipeline, events)

    asyncio.run(main())
    assert arrived == [True] * 3


def test_the_default_interval_is_a_quarter_second() -> None:
    assert INTERVAL_S == 0.25
    assert WorkerConfig().progress_interval_ms == 250
    with pytest.raises(ValueError, match="progress_interval_ms"):
        WorkerConfig(progress_interval_ms=-1)


def test_slow_steps_arrive_one_by_one_while_the_call_runs() -> None:
    sink = Sink()
    arrived_before_next: list[bool] = []

    def pipeline(events: ThreadEvents) -> None:
        for step in range(1, 5):
            events(progress("a", step))
            arrived_before_next.append(wait_until(lambda: len(sink.events) == step, timeout=5))  # noqa: B023
            time.sleep(0.06)  # a step slower than the interval

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=0.05)
        await events.run(pipeline, events)

    asyncio.run(main())
    assert arrived_before_next == [True] * 4


def test_waiting_events_are_taken_every_interval_while_the_call_runs() -> None:
    """A burst followed by a long silent stage (e.g. decode) is not held until the call ends."""
    sink = Sink()
    arrived: list[bool] = []

    def pipeline(events: ThreadEvents) -> None:
        events(progress("a", 1))
        for step in range(2, 10):
            events(progress("a", step))
        arrived.append(wait_until(lambda: len(sink.events) == 9, timeout=5))

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=0.05)
        await events.run(pipeline, events)

    asyncio.run(main())
    assert arrived == [True]


def test_a_failing_call_still_delivers_its_events_then_raises() -> None:
    sink = Sink()

    def pipeline(events: ThreadEvents) -> None:
        events(stage("a", "denoise"))
        raise RuntimeError("boom")

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=30.0)
        await events.run(pipeline, events)

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(main())
    assert [e.stage for e in sink.events] == ["denoise"]


def test_events_after_the_run_was_cancelled_still_reach_the_loop() -> None:
    sink = Sink()
    release = threading.Event()

    def pipeline(events: ThreadEvents) -> None:
        events(stage("a", "denoise"))
        release.wait(5)
        events(stage("a", "late"))

    async def main() -> None:
        events = ThreadEvents(asyncio.get_running_loop(), sink, interval=30.0)
        task = asyncio.ensure_future(events.run(pipeline, events))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [e.stage for e in sink.events] == ["denoise"]  # taken when the run was cancelled
        release.set()
        for _ in range(100):
            if len(sink.events) == 2:
                break
            await asyncio.sleep(0.02)

    asyncio.run(main())
    assert [e.stage for e in sink.events] == ["denoise", "late"]


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False
