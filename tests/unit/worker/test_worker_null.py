"""The null model in a legacy_call (or modular) worker: protocol-shaped results without compute.

The registry puts the null family's executor in front of those modes' executors
(`create_executor`), so these tests make their executor the way the daemon does.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from worker_testing import make_assignment, run_assignment

from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.messages import Assignment
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import FamilyRouter, create_executor
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.null import NullExecutor, seed_colour


@pytest.fixture
def null_executor(tmp_path: Path) -> FamilyRouter:
    """A fresh legacy_call worker's executor on an empty model dir: nothing may be built or loaded there."""
    executor = create_executor(WorkerConfig(model_dir=str(tmp_path), worker_id="w-null", backend="cpu"))
    assert isinstance(executor, FamilyRouter)
    return executor


def null_assignment(
    job_ids: tuple[str, ...] = ("job-1",), *, sleep_ms: float = 0, by_family: bool = False, **kwargs: object
) -> Assignment:
    """An assignment for the catalog's `null` model (found by source, or by family only)."""
    source = "/models/anything" if by_family else "builtin:null"
    assignment = make_assignment(job_ids=job_ids, source=source, model_id="null", **kwargs)  # type: ignore[arg-type]
    assignment.model.pipeline_class = "NullPipeline"
    if by_family:
        assignment.model.family = "null"
    if sleep_ms:
        for item in assignment.items:
            item.request.extra = {"sleep_ms_per_step": float(sleep_ms)}
    return assignment


def _progress(events: list[t.JobEvent], job_id: str) -> list[tuple[int, int]]:
    return [
        (e.progress.step, e.progress.total_steps)
        for e in events
        if e.kind is t.EventKind.PROGRESS and e.job_id == job_id
    ]


def _stages(events: list[t.JobEvent], job_id: str) -> list[tuple[str, bool]]:
    return [(e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE and e.job_id == job_id]


def test_a_batch_gets_one_result_per_job_with_valid_pngs(null_executor: FamilyRouter) -> None:
    assignment = null_assignment(("job-a", "job-b", "job-c"), seed=10, num_outputs=2)
    outcomes, _ = run_assignment(null_executor, assignment)
    assert [o.job_id for o in outcomes] == ["job-a", "job-b", "job-c"]
    for index, outcome in enumerate(outcomes):
        assert outcome.error is None and outcome.result is not None
        seeds = [10 + 100 * index, 11 + 100 * index]
        artifacts = outcome.result.artifacts
        assert [(a.index, a.seed, a.file_name) for a in artifacts] == [
            (0, seeds[0], f"{outcome.job_id}-0.png"),
            (1, seeds[1], f"{outcome.job_id}-1.png"),
        ]
        for artifact, seed in zip(artifacts, seeds, strict=True):
            assert artifact.mime_type == "image/png" and artifact.kind is t.MediaKind.IMAGE
            assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
            assert artifact.size_bytes == len(artifact.data) < 200
            image = Image.open(io.BytesIO(artifact.data))
            image.load()
            assert (image.format, image.size, artifact.width, artifact.height) == ("PNG", (8, 8), 8, 8)
            assert image.convert("RGB").getpixel((3, 3)) == seed_colour(seed)
        assert outcome.result.report.seeds == seeds
    # Same seed, same bytes; another seed, another image.
    again, _ = run_assignment(null_executor, null_assignment(("job-z",), seed=10))
    assert again[0].result.artifacts[0].sha256 == outcomes[0].result.artifacts[0].sha256
    assert outcomes[0].result.artifacts[0].sha256 != outcomes[0].result.artifacts[1].sha256


def test_the_report_is_complete_like_the_pipelines(null_executor: FamilyRouter) -> None:
    outcomes, _ = run_assignment(null_executor, null_assignment(("job-r", "job-s"), steps=3, seed=7))
    report = outcomes[0].result.report
    assert report.schema_version == "1.0.0" and len(report.run_id) == 36
    assert (report.job_id, report.worker_id, report.model, report.task) == (
        "job-r",
        "w-null",
        "null",
        t.Task.TEXT2IMAGE,
    )
    assert (report.backend, report.execution_mode, report.device, report.dtype) == (
        "cpu",
        "legacy_call",
        "cpu",
        "float32",
    )
    assert (report.pipeline_class, report.cold_start, report.attempt) == ("NullPipeline", False, 1)
    assert (report.batch_size, report.batch_group_id, report.queue_wait_ms) == (2, "bg-1", 12.5)
    assert [s.name for s in report.timings] == ["denoise", "export"]
    assert report.execution_ms >= sum(s.duration_ms for s in report.timings) * 0.99
    assert report.peak_memory_bytes > 0
    assert report.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert report.omnirt_version and report.started_at <= report.finished_at
    config = report.config_resolved
    assert (config["width"], config["height"], config["num_inference_steps"]) == (64, 64, 3)
    assert (config["seeds"], config["num_outputs"], config["output_format"]) == ([7], 1, "png")
    assert (config["pipeline_class"], config["source"], config["device"]) == (
        "NullPipeline",
        "builtin:null",
        "cpu",
    )
    assert "prompt" not in config and "negative_prompt" not in config
    # The result survives the public proto round trip.
    back = _convert.result_from_proto(_convert.result_to_proto(outcomes[0].result))
    assert (
        back.report.pipeline_class == "NullPipeline"
        and back.artifacts[0].data == outcomes[0].result.artifacts[0].data
    )


def test_one_progress_event_per_step_inside_denoise(null_executor: FamilyRouter) -> None:
    outcomes, events = run_assignment(null_executor, null_assignment(("job-p", "job-q"), steps=5))
    assert all(o.error is None for o in outcomes)
    for job_id in ("job-p", "job-q"):
        assert _progress(events, job_id) == [(i, 5) for i in range(1, 6)]
        assert _stages(events, job_id) == [
            ("denoise", False),
            ("denoise", True),
            ("export", False),
            ("export", True),
        ]
        mine = [e for e in events if e.job_id == job_id]
        first = mine[0]
        assert first.kind is t.EventKind.STATE and first.state is t.JobState.RUNNING
        assert (first.worker_id, first.attempt) == ("w-null", 1)
        kinds = [(e.kind, e.stage, e.stage_finished) for e in mine]
        start = kinds.index((t.EventKind.STAGE, "denoise", False))
        end = kinds.index((t.EventKind.STAGE, "denoise", True))
        assert all(start < i < end for i, k in enumerate(kinds) if k[0] is t.EventKind.PROGRESS)
    assert all(_convert.event_to_proto(e).job_id in ("job-p", "job-q") for e in events)


def test_it_never_loads_a_pipeline(null_executor: FamilyRouter, tmp_path: Path) -> None:
    started = time.monotonic()
    outcomes, events = run_assignment(null_executor, null_assignment(steps=1000))
    assert outcomes[0].error is None and len(_progress(events, "job-1")) == 1000
    assert time.monotonic() - started < 5
    legacy_call = null_executor.executor
    assert isinstance(legacy_call, LegacyCallExecutor)
    assert len(legacy_call.cache) == 0 and null_executor.loaded_models() == []
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_the_family_alone_picks_the_null_pipeline(null_executor: FamilyRouter) -> None:
    outcomes, _ = run_assignment(null_executor, null_assignment(by_family=True))
    assert outcomes[0].result.report.pipeline_class == "NullPipeline"
    assert outcomes[0].result.report.config_resolved["source"] == "/models/anything"


def test_a_null_run_imports_neither_torch_nor_diffusers(tmp_path: Path) -> None:
    # In a fresh interpreter: the test session may have imported them for other tests.
    tests_dir = Path(__file__).parent
    code = f"""
import sys
sys.path.insert(0, {str(tests_dir)!r})
from worker_testing import make_assignment, run_assignment
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import create_executor
executor = create_executor(WorkerConfig(model_dir={str(tmp_path)!r}, backend="cpu"))
assignment = make_assignment(source="builtin:null", model_id="null", steps=3)
outcomes, _ = run_assignment(executor, assignment)
assert outcomes[0].error is None, outcomes[0].error
print(sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_run_sync_gives_the_same_images(null_executor: FamilyRouter) -> None:
    outcomes, _ = run_assignment(null_executor, null_assignment(("job-x",), seed=3, steps=2))
    events: list[t.JobEvent] = []
    [null] = null_executor.families
    assert isinstance(null, NullExecutor)
    sync = null.run_sync(null_assignment(("job-x",), seed=3, steps=2), events.append, CancelFlags())
    assert sync[0].result.artifacts[0].sha256 == outcomes[0].result.artifacts[0].sha256
    assert _progress(events, "job-x") == [(1, 2), (2, 2)]


def test_cancel_stops_a_sleeping_run_at_the_next_step(null_executor: FamilyRouter) -> None:
    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.progress.step == 2:
            flags.request(event.job_id, "CANCELLED")

    started = time.monotonic()
    outcomes, events = run_assignment(
        null_executor, null_assignment(("job-c",), steps=100, sleep_ms=20), on_event=cancel_at_step_2
    )
    error = outcomes[0].error
    assert outcomes[0].result is None
    assert (error.code, error.message) == ("CANCELLED", "job cancelled while running")
    assert len(_progress(events, "job-c")) == 2
    assert 0.03 < time.monotonic() - started < 1.5
    assert ("denoise", True) not in _stages(events, "job-c")


def test_a_cancel_from_the_loop_lands_while_it_sleeps(null_executor: FamilyRouter) -> None:
    # As in the daemon: the flag is raised by another task on the loop while the job sleeps.
    async def go() -> tuple[list, float]:
        flags = CancelFlags()
        assignment = null_assignment(("job-l",), steps=1000, sleep_ms=10)
        run = asyncio.create_task(null_executor.run(assignment, lambda e: None, flags))
        await asyncio.sleep(0.1)
        cancelled_at = time.monotonic()
        flags.request("job-l", "CANCELLED")
        outcomes = await run
        return outcomes, time.monotonic() - cancelled_at

    outcomes, took = asyncio.run(go())
    assert outcomes[0].error.code == "CANCELLED"
    assert took < 0.5


def test_one_cancelled_job_does_not_stop_its_batch(null_executor: FamilyRouter) -> None:
    def cancel_p(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.job_id == "job-p" and event.progress.step == 1:
            flags.request("job-p", "CANCELLED")

    outcomes, events = run_assignment(
        null_executor, null_assignment(("job-p", "job-q"), steps=4, sleep_ms=5), on_event=cancel_p
    )
    assert outcomes[0].error.code == "CANCELLED"
    assert outcomes[1].error is None and outcomes[1].result.artifacts
    assert len(_progress(events, "job-p")) == 1 and len(_progress(events, "job-q")) == 4


def test_a_deadline_during_the_run_stops_it(null_executor: FamilyRouter) -> None:
    soon = int(time.time() * 1000) + 200
    started = time.monotonic()
    outcomes, events = run_assignment(
        null_executor, null_assignment(("job-d",), steps=1000, sleep_ms=20, deadline_ms=soon)
    )
    error = outcomes[0].error
    assert (error.code, error.message) == ("DEADLINE_EXCEEDED", "deadline exceeded while running")
    assert 0 < len(_progress(events, "job-d")) < 1000
    assert time.monotonic() - started < 1.5


def test_the_requests_own_deadline_counts_too(null_executor: FamilyRouter) -> None:
    assignment = null_assignment(("job-e",), steps=1000, sleep_ms=20)
    assignment.items[0].request.deadline_ms = int(time.time() * 1000) + 100
    outcomes, _ = run_assignment(null_executor, assignment)
    assert outcomes[0].error.code == "DEADLINE_EXCEEDED"


@pytest.mark.parametrize(
    ("stop", "code"),
    [("cancel", "CANCELLED"), ("deadline", "DEADLINE_EXCEEDED")],
)
def test_stopped_before_start_never_steps(null_executor: FamilyRouter, stop: str, code: str) -> None:
    flags = CancelFlags()
    deadline = int(time.time() * 1000) - 1000 if stop == "deadline" else 0
    if stop == "cancel":
        flags.request("job-early", "CANCELLED")
    assignment = null_assignment(("job-early",), deadline_ms=deadline)
    outcomes, events = run_assignment(null_executor, assignment, flags=flags)
    assert outcomes[0].error.code == code
    assert outcomes[0].error.message.endswith("before start")
    assert not _progress(events, "job-early")


@pytest.mark.parametrize(
    ("extra", "output_format", "field"),
    [
        ({"guidance_rescale": 0.5}, "png", "extra.guidance_rescale"),
        ({"sleep_ms_per_step": -1.0}, "png", "extra.sleep_ms_per_step"),
        ({"sleep_ms_per_step": "slow"}, "png", "extra.sleep_ms_per_step"),
        ({}, "tiff", "output.format"),
    ],
)
def test_bad_requests_are_invalid_argument_per_job(
    null_executor: FamilyRouter, extra: dict, output_format: str, field: str
) -> None:
    assignment = null_assignment(("job-bad", "job-good"))
    assignment.items[0].request.extra = extra
    assignment.items[0].request.output_format = output_format
    outcomes, _ = run_assignment(null_executor, assignment)
    assert (outcomes[0].error.code, outcomes[0].error.field) == ("INVALID_ARGUMENT", field)
    assert outcomes[1].error is None


def test_other_image_formats(null_executor: FamilyRouter) -> None:
    assignment = null_assignment(("job-w",))
    assignment.items[0].request.output_format = "webp"
    outcomes, _ = run_assignment(null_executor, assignment)
    artifact = outcomes[0].result.artifacts[0]
    assert (artifact.mime_type, artifact.file_name) == ("image/webp", "job-w-0.webp")
    assert Image.open(io.BytesIO(artifact.data)).format == "WEBP"


@pytest.mark.parametrize("mode", ["legacy_call", "modular"])
def test_a_legacy_call_or_modular_worker_runs_it_and_reports_legacy_call(mode: str, tmp_path: Path) -> None:
    executor = create_executor(WorkerConfig(mode=mode, model_dir=str(tmp_path), worker_id="w", backend="cpu"))
    assert executor.mode.value == mode  # the worker still says its own mode
    outcomes, _ = run_assignment(executor, null_assignment(("job-m",), steps=2))
    report = outcomes[0].result.report
    assert (report.execution_mode, report.pipeline_class) == ("legacy_call", "NullPipeline")
    assert executor.loaded_models() == [] and list(tmp_path.iterdir()) == []
    asyncio.run(executor.preload(null_assignment().model))  # nothing to load, no error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("mode", ["subprocess", "persistent_worker"])
def test_the_other_modes_do_not_host_the_null_family(mode: str) -> None:
    assert not isinstance(create_executor(WorkerConfig(mode=mode)), FamilyRouter)
