"""AsyncClient: the same calls, awaited."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sdk_fake_server import FakeController, failure_events, job, sample_result

from omnirt import AsyncClient, errors
from omnirt.types import EventKind, JobError, JobState


def test_async_flow(fake: FakeController, tmp_path: Path) -> None:
    fake.downloads[("job-1", 0)] = b"abcdefghijk"

    async def scenario() -> None:
        async with AsyncClient(fake.address, timeout=10) as client:
            result = await client.generate(model="tiny-sd", prompt="a fox", seed=42)
            assert result.report.seeds == [42]
            submitted = await client.submit(model="tiny-sd", prompt="a fox")
            kinds = [e.kind async for e in client.watch(submitted.id)]
            assert kinds.count(EventKind.PROGRESS) == 4
            waited = await client.wait(submitted.id, timeout=10)
            assert waited.job_id == submitted.id == "job-2"
            assert (await client.get_job("job-2")).state is JobState.QUEUED
            assert [j.id for j in await client.list_jobs(limit=1)] == ["job-2"]
            assert (await client.cancel("job-2")).cancelled
            plan = await client.validate(model="tiny-sd", prompt="x")
            assert plan.execution_mode == "legacy_call"
            assert [m.id for m in await client.list_models("text2image")] == ["tiny-sd"]
            assert (await client.describe_model("tiny-sd")).family == "sd"
            assert (await client.list_workers())[0].busy_slots == 1
            assert await client.download_artifact("job-1", 0) == b"abcdefghijk"
            paths = await client.save(sample_result(inline=False), tmp_path)
            assert paths[0].read_bytes() == b"abcdefghijk"

    asyncio.run(scenario())


def test_async_wait_raises_the_jobs_error(fake: FakeController) -> None:
    error = JobError("FAILED_PRECONDITION", "model failed to load")
    fake.events["j"] = failure_events("j", JobState.FAILED, error)
    fake.jobs["j"] = job("j", JobState.FAILED, error=error)

    async def scenario() -> None:
        async with AsyncClient(fake.address) as client:
            with pytest.raises(errors.FailedPrecondition, match="model failed to load"):
                await client.wait("j")

    asyncio.run(scenario())


def test_async_wait_with_a_timeout_raises_the_jobs_own_deadline(fake: FakeController) -> None:
    error = JobError("DEADLINE_EXCEEDED", "deadline passed while queued")
    fake.events["j"] = failure_events("j", JobState.FAILED, error)
    fake.jobs["j"] = job("j", JobState.FAILED, error=error)

    async def scenario() -> None:
        async with AsyncClient(fake.address) as client:
            with pytest.raises(errors.DeadlineExceeded, match="deadline passed while queued"):
                await client.wait("j", timeout=30)

    asyncio.run(scenario())
