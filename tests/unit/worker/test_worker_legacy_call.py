"""The legacy_call executor run in-process on assignments shaped like the controller's."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from worker_testing import make_assignment, run_assignment

from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

STAGES = ("load", "denoise", "decode", "export")


def _stages(events: list[t.JobEvent]) -> list[tuple[str, bool]]:
    return [(e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE]


def _progress(events: list[t.JobEvent]) -> list[tuple[int, int]]:
    return [(e.progress.step, e.progress.total_steps) for e in events if e.kind is t.EventKind.PROGRESS]


@pytest.fixture(scope="module")
def cold_then_warm(model_dir: Path):
    """Two runs of the same model on a fresh executor: the first loads it, the second does not."""
    fresh = LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-test", torch_threads=1))
    cold = run_assignment(fresh, make_assignment(job_ids=("job-cold",)))
    warm = run_assignment(fresh, make_assignment(job_ids=("job-warm",)))
    return fresh, cold, warm


def test_result_is_a_64x64_png_with_matching_sha256(cold_then_warm) -> None:
    _, (outcomes, _), _ = cold_then_warm
    assert [o.job_id for o in outcomes] == ["job-cold"]
    assert outcomes[0].error is None
    result = outcomes[0].result
    assert result.job_id == "job-cold"
    [artifact] = result.artifacts
    assert artifact.mime_type == "image/png" and artifact.kind is t.MediaKind.IMAGE
    assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
    assert artifact.size_bytes == len(artifact.data)
    assert (artifact.width, artifact.height, artifact.seed, artifact.index) == (64, 64, 7, 0)
    assert artifact.file_name == "job-cold-0.png"
    assert Image.open(io.BytesIO(artifact.data)).size == (64, 64)


def test_events_running_then_stages_and_one_progress_per_step(cold_then_warm) -> None:
    _, (_, events), _ = cold_then_warm
    assert all(e.job_id == "job-cold" and e.sequence == 0 and e.time is not None for e in events)
    first = events[0]
    assert first.kind is t.EventKind.STATE and first.state is t.JobState.RUNNING
    assert (first.worker_id, first.attempt) == ("w-test", 1)
    assert _progress(events) == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert _stages(events) == [(name, done) for name in STAGES for done in (False, True)]
    finished = [e for e in events if e.kind is t.EventKind.STAGE and e.stage_finished]
    assert all(e.stage_duration_ms > 0 for e in finished)
    # Progress happens inside denoise.
    kinds = [(e.kind, e.stage, e.stage_finished) for e in events]
    assert kinds.index((t.EventKind.STAGE, "denoise", False)) < kinds.index((t.EventKind.PROGRESS, "", False))
    # Every event converts to the public proto.
    assert all(_convert.event_to_proto(e).job_id == "job-cold" for e in events)


def test_run_report_is_complete(cold_then_warm) -> None:
    _, (outcomes, _), _ = cold_then_warm
    report = outcomes[0].result.report
    assert report.schema_version == "1.0.0"
    assert len(report.run_id) == 36
    assert (report.job_id, report.worker_id, report.model) == ("job-cold", "w-test", "tiny-sd")
    assert report.task is t.Task.TEXT2IMAGE
    assert (report.backend, report.execution_mode, report.device, report.dtype) == (
        "cpu",
        "legacy_call",
        "cpu",
        "float32",
    )
    assert report.queue_wait_ms == 12.5
    assert [s.name for s in report.timings] == list(STAGES)
    offsets = [s.start_offset_ms for s in report.timings]
    assert offsets == sorted(offsets)
    assert report.execution_ms >= sum(s.duration_ms for s in report.timings) * 0.99
    assert report.peak_memory_bytes > 10 * 2**20
    assert report.cold_start is True
    assert (report.attempt, report.batch_size, report.seeds) == (1, 1, [7])
    assert report.pipeline_class == "StableDiffusionPipeline"
    assert report.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert report.omnirt_version
    assert report.started_at <= report.finished_at
    config = report.config_resolved
    assert config["width"] == config["height"] == 64
    assert config["num_inference_steps"] == 4 and config["guidance_scale"] == 5.0
    assert config["seeds"] == [7] and config["num_outputs"] == 1
    assert config["scheduler"] == "EulerDiscreteScheduler"
    assert (config["dtype"], config["device"], config["source"]) == ("float32", "cpu", "builtin:tiny-sd")
    assert config["pipeline_class"] == "StableDiffusionPipeline"
    assert "prompt" not in config and "negative_prompt" not in config
    # The report survives the public proto round trip.
    assert _convert.result_from_proto(_convert.result_to_proto(outcomes[0].result)).report.seeds == [7]


def test_second_run_is_warm(cold_then_warm) -> None:
    executor, (cold, _), (warm, events) = cold_then_warm
    report = warm[0].result.report
    assert report.cold_start is False
    assert report.timing("load") is None
    assert ("load", False) not in _stages(events)
    assert executor.loaded_models() == ["tiny-sd"]
    # Same request, same seed: the same bytes on the warm pipeline.
    assert warm[0].result.artifacts[0].sha256 == cold[0].result.artifacts[0].sha256


def test_num_outputs_use_consecutive_seeds(executor: LegacyCallExecutor) -> None:
    outcomes, _ = run_assignment(executor, make_assignment(job_ids=("job-n",), seed=40, num_outputs=2))
    artifacts = outcomes[0].result.artifacts
    assert [(a.index, a.seed, a.file_name) for a in artifacts] == [
        (0, 40, "job-n-0.png"),
        (1, 41, "job-n-1.png"),
    ]
    assert artifacts[0].sha256 != artifacts[1].sha256
    assert outcomes[0].result.report.seeds == [40, 41]


def test_a_batch_runs_as_one_call_with_per_job_results(executor: LegacyCallExecutor) -> None:
    assignment = make_assignment(job_ids=("job-a", "job-b"), seed=5)
    outcomes, events = run_assignment(executor, assignment)
    assert [o.job_id for o in outcomes] == ["job-a", "job-b"]
    seeds = [[a.seed for a in o.result.artifacts] for o in outcomes]
    assert seeds == [[5], [105]]
    for outcome in outcomes:
        report = outcome.result.report
        assert (report.batch_size, report.batch_group_id) == (2, "bg-1")
        assert [s.name for s in report.timings][-3:] == ["denoise", "decode", "export"]
    for job_id in ("job-a", "job-b"):
        assert _progress([e for e in events if e.job_id == job_id]) == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_scheduler_is_swapped_by_class_name(executor: LegacyCallExecutor) -> None:
    outcomes, _ = run_assignment(
        executor, make_assignment(job_ids=("job-s",), scheduler="DPMSolverMultistepScheduler")
    )
    assert outcomes[0].result.report.config_resolved["scheduler"] == "DPMSolverMultistepScheduler"
    assert not outcomes[0].result.report.warnings  # listed as compatible with the pipeline's own
    # The cached pipeline keeps its own scheduler for the next request.
    outcomes, _ = run_assignment(executor, make_assignment(job_ids=("job-s2",)))
    assert outcomes[0].result.report.config_resolved["scheduler"] == "EulerDiscreteScheduler"
    # One the pipeline's scheduler does not list still runs, with a warning in the report.
    outcomes, _ = run_assignment(executor, make_assignment(job_ids=("job-s3",), scheduler="LCMScheduler"))
    report = outcomes[0].result.report
    assert report.config_resolved["scheduler"] == "LCMScheduler"
    assert report.warnings == ["scheduler LCMScheduler is not listed as compatible with this pipeline"]


def test_the_sde_scheduler_gives_the_same_bytes_for_the_same_seed(executor: LegacyCallExecutor) -> None:
    """DPM-Solver SDE draws Brownian noise from a seed of its own (torch's global RNG when unset):
    the worker seeds it from the request, so a seed reproduces its image like any scheduler's."""

    def image(job_id: str, seed: int) -> str:
        [outcome], _ = run_assignment(
            executor, make_assignment(job_ids=(job_id,), scheduler="DPMSolverSDEScheduler", seed=seed)
        )
        assert outcome.result is not None, outcome.error
        assert outcome.result.report.config_resolved["scheduler"] == "DPMSolverSDEScheduler"
        return outcome.result.artifacts[0].sha256

    first, again, other = image("job-sde1", 7), image("job-sde2", 7), image("job-sde3", 8)
    assert first == again
    assert first != other


def test_unknown_scheduler_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    outcomes, _ = run_assignment(executor, make_assignment(job_ids=("job-x",), scheduler="NoSuchScheduler"))
    error = outcomes[0].error
    assert (error.code, error.field) == ("INVALID_ARGUMENT", "scheduler")
    assert "NoSuchScheduler" in error.message


@pytest.mark.parametrize(
    "source",
    ["omnirt-test/no-such-model", "/nonexistent/omnirt/model", "builtin:tiny-nothing"],
)
def test_bad_source_is_failed_precondition_and_the_worker_goes_on(
    executor: LegacyCallExecutor, source: str
) -> None:
    bad, _ = run_assignment(executor, make_assignment(job_ids=("job-bad",), source=source, model_id="broken"))
    error = bad[0].error
    assert error.code == "FAILED_PRECONDITION"
    assert "'broken'" in error.message and source in error.message
    good, _ = run_assignment(executor, make_assignment(job_ids=("job-good",)))
    assert good[0].error is None and good[0].result.artifacts
    assert "broken" not in executor.loaded_models()


def test_cancel_stops_at_the_next_step(live_executor: LegacyCallExecutor) -> None:
    raised: list[datetime] = []

    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.progress.step == 2:
            flags.request(event.job_id, "CANCELLED")
            raised.append(datetime.now(UTC))

    outcomes, events = run_assignment(
        live_executor, make_assignment(job_ids=("job-c",), steps=50), on_event=cancel_at_step_2
    )
    assert outcomes[0].error.code == "CANCELLED"
    assert outcomes[0].result is None
    # The flag is raised on the loop when step 2's event arrives there (the pipeline may be
    # further on by then); from that moment the call ends at the next step end: the step
    # running then is the last one.
    steps = [e for e in events if e.kind is t.EventKind.PROGRESS]
    assert 2 <= len(steps) < 50
    assert len([e for e in steps if e.time > raised[0]]) <= 1


def test_cancelled_before_start_never_runs(executor: LegacyCallExecutor) -> None:
    flags = CancelFlags()
    flags.request("job-early", "CANCELLED")
    outcomes, events = run_assignment(executor, make_assignment(job_ids=("job-early",)), flags=flags)
    assert outcomes[0].error.code == "CANCELLED"
    assert not _progress(events)


def test_deadline_in_the_past_is_deadline_exceeded(executor: LegacyCallExecutor) -> None:
    past = int(time.time() * 1000) - 1000
    outcomes, events = run_assignment(executor, make_assignment(job_ids=("job-d",), deadline_ms=past))
    assert outcomes[0].error.code == "DEADLINE_EXCEEDED"
    assert not _progress(events)


def test_deadline_during_the_run_stops_it(executor: LegacyCallExecutor) -> None:
    soon = int(time.time() * 1000) + 300
    started = time.monotonic()
    outcomes, events = run_assignment(
        executor, make_assignment(job_ids=("job-dl",), steps=400, deadline_ms=soon)
    )
    assert outcomes[0].error.code == "DEADLINE_EXCEEDED"
    assert 0 < len(_progress(events)) < 400
    assert time.monotonic() - started < 5


def test_one_cancelled_job_does_not_stop_its_batch(live_executor: LegacyCallExecutor) -> None:
    def cancel_first(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.job_id == "job-p" and event.progress.step == 1:
            flags.request("job-p", "CANCELLED")

    outcomes, _ = run_assignment(
        live_executor, make_assignment(job_ids=("job-p", "job-q")), on_event=cancel_first
    )
    assert outcomes[0].error.code == "CANCELLED"
    assert outcomes[1].error is None and outcomes[1].result.artifacts


def test_unsupported_output_format_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    assignment = make_assignment(job_ids=("job-f",))
    assignment.items[0].request.output_format = "tiff"
    outcomes, _ = run_assignment(executor, assignment)
    assert (outcomes[0].error.code, outcomes[0].error.field) == ("INVALID_ARGUMENT", "output.format")


def _pixels(outcome: Any) -> Any:
    import numpy as np

    return np.asarray(Image.open(io.BytesIO(outcome.result.artifacts[0].data))).astype(int)


@pytest.mark.parametrize("step_engine", [False, True], ids=["calls-alone", "step-engine"])
def test_two_slots_share_one_cached_pipeline_safely(executor: LegacyCallExecutor, step_engine: bool) -> None:
    """Two calls at once on one cached pipeline leak no state into each other: with
    `--no-step-engine` each gives its bytes alone; with the step engine (the default) their rows
    share each forward, which holds them to the batch-of-N bound (3/255), not to the bytes: a
    row's float sums depend on its place in the batch (1/255 seen, by which call came first)."""
    config = WorkerConfig(
        model_dir=executor.config.model_dir, worker_id="w-2", torch_threads=1, step_engine=step_engine
    )
    slots = LegacyCallExecutor(config, cache=executor.cache)
    jobs = (("job-s1", 11), ("job-s2", 12))
    alone = {}
    for job_id, seed in jobs:
        outcomes, _ = run_assignment(slots, make_assignment(job_ids=(job_id,), seed=seed, steps=8))
        alone[job_id] = outcomes[0]

    async def together() -> list:
        flags = CancelFlags()
        runs = [
            slots.run(make_assignment(job_ids=(j,), seed=seed, steps=8), lambda e: None, flags)
            for j, seed in jobs
        ]
        return await asyncio.gather(*runs)

    both = {o[0].job_id: o[0] for o in asyncio.run(together())}
    for job_id, outcome in both.items():
        shared = outcome.result.report.config_resolved.get("step_engine")
        if step_engine:
            assert shared["used"] and shared["peak_rows"] == 4  # the two calls shared forwards
            assert abs(_pixels(outcome) - _pixels(alone[job_id])).max() <= 3
        else:
            assert shared is None
            assert outcome.result.artifacts[0].sha256 == alone[job_id].result.artifacts[0].sha256


def test_two_calls_at_once_on_one_pipeline_never_share_a_tokenizer(
    executor: LegacyCallExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fast tokenizer sets its padding and truncation, then encodes: two calls of one pipeline
    using it at once could pad one call's prompt as the other asked (seen: 11 tokens against 77,
    a job failed INTERNAL). Each call must hold tokenizers no other call is using."""
    from transformers import CLIPTokenizer

    run_assignment(executor, make_assignment(job_ids=("warm",), steps=1))  # loaded before the race
    original = CLIPTokenizer.__call__
    inside: dict[int, int] = {}
    shared: list[int] = []
    lock = threading.Lock()
    both_in = threading.Barrier(2, timeout=5)
    first = threading.local()

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            inside[id(self)] = inside.get(id(self), 0) + 1
            if inside[id(self)] > 1:
                shared.append(id(self))
        try:
            if not getattr(first, "done", False):  # each call's first encode waits for the other's
                first.done = True
                with contextlib.suppress(threading.BrokenBarrierError):
                    both_in.wait()
            return original(self, *args, **kwargs)
        finally:
            with lock:
                inside[id(self)] -= 1

    monkeypatch.setattr(CLIPTokenizer, "__call__", counted)
    outcomes: list[list] = []
    threads = [
        threading.Thread(
            target=lambda job=job: outcomes.append(
                run_assignment(executor, make_assignment(job_ids=(job,), steps=1))[0]
            )
        )
        for job in ("left", "right")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [o.error for run in outcomes for o in run] == [None, None]
    assert not shared, "two calls used one tokenizer at the same time"
