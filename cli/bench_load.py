"""The closed-loop load of `omnirtctl bench`: N callers, each submitting its next request as
soon as its last one ended, bounded in count and in time.

Each request goes the streaming way a user's would: `Submit`, then `WatchJob` until the
job ends, so the driver sees when the first PROGRESS event arrives and reads the RunReport
(queue wait, execution time, batch size) of the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from omnirt.aio import AsyncClient
from omnirt.cli.bench_stats import UNFINISHED, Sample
from omnirt.errors import OmniRTError
from omnirt.types import EventKind, GenerateRequest, JobEvent

# How long cancelling the jobs cut off at the time limit may take before the bench gives up on it.
CANCEL_TIMEOUT_S = 10.0


@dataclass
class Phase:
    """What one phase (the warmup or the measured load) did."""

    samples: list[Sample] = field(default_factory=list)
    wall_s: float = 0.0
    stopped_by: str = "total"
    cancelled_jobs: int = 0


class _InFlight:
    """A request on its way: when it was sent, its job id once known, its first progress."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.job_id = ""
        self.ttfp_s: float | None = None

    def on_event(self, event: JobEvent) -> None:
        if self.ttfp_s is None and event.kind is EventKind.PROGRESS:
            self.ttfp_s = time.monotonic() - self.started

    def elapsed(self) -> float:
        return time.monotonic() - self.started


async def measure(client: AsyncClient, request: GenerateRequest, flight: _InFlight) -> Sample:
    """Send one request and follow it to its end; a failure is a sample too, never an exception."""
    try:
        job = await client.submit(request)
        flight.job_id = job.id
        result = await client.wait(job.id, on_event=flight.on_event)
    except OmniRTError as exc:
        message = exc.message if not exc.field or exc.field in exc.message else f"{exc.field}: {exc.message}"
        return Sample(
            latency_s=flight.elapsed(), ok=False, status=exc.code.name, message=message, ttfp_s=flight.ttfp_s
        )
    report = result.report
    return Sample(
        latency_s=flight.elapsed(),
        ok=True,
        ttfp_s=flight.ttfp_s,
        queue_wait_ms=report.queue_wait_ms,
        execution_ms=report.execution_ms,
        batch_size=report.batch_size,
        cold_start=report.cold_start,
    )


async def run_phase(
    client: AsyncClient,
    requests: Sequence[GenerateRequest],
    *,
    count: int,
    concurrency: int,
    limit_s: float,
    grace_s: float,
    on_sample: Callable[[Sample], None] = lambda sample: None,
) -> Phase:
    """Send `count` requests (round robin over `requests`) with `concurrency` in flight.

    After `limit_s` no request is sent any more; those in flight get `grace_s` more to end,
    then count as UNFINISHED and their jobs are cancelled on the controller."""
    phase = Phase()
    if count <= 0:
        return phase
    started = time.monotonic()
    stop_at = started + limit_s
    sent = 0
    in_flight: dict[int, _InFlight] = {}

    def record(sample: Sample) -> None:
        phase.samples.append(sample)
        on_sample(sample)

    async def caller() -> None:
        nonlocal sent
        while sent < count and time.monotonic() < stop_at:
            index, sent = sent, sent + 1
            flight = in_flight[index] = _InFlight()
            try:
                sample = await measure(client, requests[index % len(requests)], flight)
            finally:
                del in_flight[index]
            record(sample)

    callers = [asyncio.create_task(caller()) for _ in range(min(concurrency, count))]
    try:
        _, pending = await asyncio.wait(callers, timeout=limit_s)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        if pending or sent < count:
            phase.stopped_by = "duration"
        cut_off = list(in_flight.values())
        for flight in cut_off:
            where = f"job {flight.job_id}" if flight.job_id else "the submit call"
            message = f"{where} had not ended when --duration plus --grace ({limit_s + grace_s:g} s) ran out"
            record(
                Sample(flight.elapsed(), ok=False, status=UNFINISHED, message=message, ttfp_s=flight.ttfp_s)
            )
        phase.wall_s = time.monotonic() - started
    finally:
        # Also on Ctrl-C: stop the callers, and leave no job running for nobody.
        abandoned = [f.job_id for f in in_flight.values() if f.job_id]
        for task in callers:
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        phase.cancelled_jobs = await asyncio.shield(cancel_jobs(client, abandoned))
    for task in callers:  # a bug in the driver must not pass for a measurement
        if not task.cancelled() and (error := task.exception()) is not None:
            raise error
    return phase


async def cancel_jobs(client: AsyncClient, job_ids: Sequence[str]) -> int:
    """Cancel the jobs (best effort, bounded in time); the number actually cancelled."""
    if not job_ids:
        return 0

    async def cancel(job_id: str) -> bool:
        with contextlib.suppress(OmniRTError):
            return (await client.cancel(job_id)).cancelled
        return False

    try:
        async with asyncio.timeout(CANCEL_TIMEOUT_S):
            return sum(await asyncio.gather(*(cancel(j) for j in job_ids)))
    except TimeoutError:
        return 0
