"""The persistent_worker executor: a real torchrun process group of the tiny-sd pipeline.

One 2-rank group is shared by the tests of this module (a start costs several seconds):
they run in file order (cold start, warm, cancel, bad input, a killed rank and the restart,
idle unload, preload) and the last one closes the executor.
"""

from __future__ import annotations

import functools
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import make_assignment

from omnirt import types as t
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.persistent.executor import PersistentWorkerExecutor
from omnirt.worker.modes.persistent.launch import pid_alive

CFG2 = "tiny-sd-cfg2"
CFG2_RUNTIME = {"nproc_per_node": 2.0, "restart_backoff_s": 0.2}
# Outputs may differ from the single-process pipeline by float rounding: the split runs the
# UNet on a batch of 1 per rank where the pipeline runs one batch of 2, and batched kernels
# may sum in another order (about 1e-7 relative); 4 Euler steps and the VAE amplify that to
# at most a step of the uint8 rounding. 2/255 leaves room for another BLAS; any real error
# (a wrong guidance formula, misaligned seeds) changes pixels by tens of levels.
MAX_PIXEL_DIFF = 2
seen_pids: list[int] = []


@pytest.fixture(scope="module")
def pw(model_dir: Path) -> Iterator[PersistentWorkerExecutor]:
    executor = PersistentWorkerExecutor(
        WorkerConfig(mode="persistent_worker", model_dir=str(model_dir), worker_id="w-pw", torch_threads=1)
    )
    yield executor
    executor.close_sync()


def cfg2_assignment(**kwargs: Any) -> Assignment:
    runtime = kwargs.pop("runtime", CFG2_RUNTIME)
    assignment = make_assignment(model_id=kwargs.pop("model_id", CFG2), **kwargs)
    assignment.model.runtime = dict(runtime)
    return assignment


def run(
    executor: PersistentWorkerExecutor, assignment: Assignment, on_event: Any = None
) -> tuple[ItemOutcome, list[t.JobEvent]]:
    flags = CancelFlags()
    events: list[t.JobEvent] = []

    def emit(event: t.JobEvent) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event, flags)

    (outcome,) = executor.run_sync(assignment, emit, flags)
    return outcome, events


def pixels(outcome: ItemOutcome) -> np.ndarray:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return np.asarray(Image.open(io.BytesIO(outcome.result.artifacts[0].data)).convert("RGB")).astype(int)


@functools.cache
def reference(model_dir: Path, *, seed: int = 7, guidance: float = 5.0, steps: int = 4) -> np.ndarray:
    """What StableDiffusionPipeline makes in this process for make_assignment's request."""
    import diffusers
    import torch

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"))
    pipe.set_progress_bar_config(disable=True)
    image = pipe(
        prompt="a watercolor fox number 0",
        negative_prompt="blurry",
        width=64,
        height=64,
        num_inference_steps=steps,
        guidance_scale=guidance,
        generator=[torch.Generator("cpu").manual_seed(seed)],
    ).images[0]
    return np.asarray(image.convert("RGB")).astype(int)


def stages(events: list[t.JobEvent]) -> list[str]:
    out = []
    for e in events:
        if e.kind is t.EventKind.STAGE:
            out.append(f"{e.stage}:{'end' if e.stage_finished else 'start'}")
        elif e.kind is t.EventKind.PROGRESS and e.progress:
            out.append(f"step{e.progress.step}")
    return out


def test_first_request_is_cold_then_warm_and_equals_the_single_process_pipeline(
    pw: PersistentWorkerExecutor, model_dir: Path
) -> None:
    cold, events = run(pw, cfg2_assignment())
    assert stages(events) == [
        "load:start",
        "load:end",
        "denoise:start",
        "step1",
        "step2",
        "step3",
        "step4",
        "denoise:end",
        "decode:start",
        "decode:end",
        "export:start",
        "export:end",
    ]
    assert cold.result is not None
    report = cold.result.report
    assert report.cold_start is True and (report.timing("load") or 0) > 0
    assert (report.execution_mode, report.backend, report.device) == ("persistent_worker", "cpu", "cpu")
    config = report.config_resolved
    assert (
        config["nproc_per_node"] == 2 and config["dist_backend"] == "gloo" and config["cfg_parallel"] is True
    )
    assert report.seeds == [7] and report.peak_memory_bytes > 0
    assert pw.loaded_models() == [CFG2]
    group = pw.group(CFG2)
    assert group is not None and len(group.pids()) == 3  # the torchrun agent and 2 ranks
    seen_pids.extend(group.pids())

    warm, events = run(pw, cfg2_assignment())
    assert warm.result is not None
    assert warm.result.report.cold_start is False and warm.result.report.timing("load") is None
    assert "load:start" not in stages(events)
    assert warm.result.report.timing("denoise") < report.timing("load")
    assert warm.result.artifacts[0].data == cold.result.artifacts[0].data, "same seed, same bytes"

    diff = np.abs(pixels(cold) - reference(model_dir)).max()
    assert diff <= MAX_PIXEL_DIFF, f"differs from StableDiffusionPipeline by {diff}/255"
    other = np.abs(pixels(run(pw, cfg2_assignment(seed=8))[0]) - pixels(cold)).max()
    assert other > 10 * MAX_PIXEL_DIFF, "another seed must give another image"


def test_cancel_at_a_step_stops_every_rank_and_the_group_keeps_serving(pw: PersistentWorkerExecutor) -> None:
    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.progress and event.progress.step == 2:
            flags.request(event.job_id)

    outcome, events = run(pw, cfg2_assignment(steps=6), cancel_at_step_2)
    assert outcome.error is not None and outcome.error.code == "CANCELLED"
    assert "while running" in outcome.error.message
    assert [s for s in stages(events) if s.startswith("step")] == ["step1", "step2"]
    again, _ = run(pw, cfg2_assignment())
    assert again.error is None and again.result is not None and again.result.report.cold_start is False


def test_bad_requests_get_precise_errors_and_the_group_keeps_serving(pw: PersistentWorkerExecutor) -> None:
    odd = cfg2_assignment()
    odd.items[0].request.width = 60  # the controller refuses this too; the ranks must as well
    outcome, _ = run(pw, odd)
    assert outcome.error is not None and (outcome.error.code, outcome.error.field) == (
        "INVALID_ARGUMENT",
        "width",
    )

    extra = cfg2_assignment()
    extra.items[0].request.extra = {"eta": 0.5}
    outcome, _ = run(pw, extra)
    assert outcome.error is not None and (outcome.error.code, outcome.error.field) == (
        "INVALID_ARGUMENT",
        "extra.eta",
    )

    outcome, _ = run(pw, cfg2_assignment(scheduler="NoSuchScheduler"))
    assert outcome.error is not None and outcome.error.field == "scheduler"

    bad = cfg2_assignment(model_id="tiny-sd-bad", runtime={"nproc_per_node": 0.0})
    outcome, _ = run(pw, bad)
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "runtime.nproc_per_node" in outcome.error.message

    good, _ = run(pw, cfg2_assignment())
    assert good.error is None and pw.loaded_models() == [CFG2]


def test_a_killed_rank_fails_the_job_unavailable_and_the_group_restarts(pw: PersistentWorkerExecutor) -> None:
    group = pw.group(CFG2)
    assert group is not None
    before = group.pids()

    def kill_rank_1(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.progress and event.progress.step == 1:
            os.kill(before[2], signal.SIGKILL)

    outcome, _ = run(pw, cfg2_assignment(), kill_rank_1)
    assert outcome.error is not None and outcome.error.code == "UNAVAILABLE", outcome.error
    assert "restarted" in outcome.error.message
    assert CFG2 not in pw.loaded_models(), "a dead group is not reported as loaded"
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in before), "the rest of the dead group is stopped"

    after, events = run(pw, cfg2_assignment())
    assert after.error is None and after.result is not None
    assert after.result.report.cold_start is True and "load:end" in stages(events)
    assert set(group.pids()).isdisjoint(before) and len(group.pids()) == 3
    seen_pids.extend(group.pids())
    assert pw.loaded_models() == [CFG2]


def test_one_rank_runs_the_pipelines_batched_guidance_exactly(model_dir: Path) -> None:
    """Without torchrun: the loop on one rank is StableDiffusionPipeline's, pixel for pixel."""
    import diffusers

    from omnirt.worker.modes.persistent.cfg_denoise import TextJob, generate

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"))
    job = TextJob("a watercolor fox number 0", "blurry", 64, 64, 4, 5.0, [7])
    (image,) = generate(pipe, job, "cpu") or []
    assert (np.asarray(image).astype(int) == reference(model_dir)).all()


def test_new_idle_settings_apply_without_a_restart_and_an_idle_group_is_unloaded(
    pw: PersistentWorkerExecutor,
) -> None:
    group = pw.group(CFG2)
    assert group is not None
    pids = group.pids()
    outcome, _ = run(pw, cfg2_assignment(runtime={**CFG2_RUNTIME, "idle_unload_s": 0.5}))
    assert outcome.result is not None and outcome.result.report.cold_start is False
    assert pw.group(CFG2) is group and group.pids() == pids
    deadline = time.monotonic() + 15
    while (CFG2 in pw.loaded_models() or any(pid_alive(p) for p in pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert CFG2 not in pw.loaded_models() and group.pids() == []
    assert not any(pid_alive(p) for p in pids)


def test_a_preloaded_group_is_warm_for_its_first_request(pw: PersistentWorkerExecutor) -> None:
    assignment = cfg2_assignment(model_id="tiny-sd-preloaded")
    pw.preload_sync(assignment.model)  # what the daemon's --preload does at start-up
    assert "tiny-sd-preloaded" in pw.loaded_models()
    group = pw.group("tiny-sd-preloaded")
    assert group is not None and len(group.pids()) == 3
    seen_pids.extend(group.pids())
    outcome, events = run(pw, assignment)
    assert outcome.result is not None and outcome.result.report is not None
    assert outcome.result.report.cold_start is False and outcome.result.report.timing("load") is None
    assert "load:start" not in stages(events)


def test_a_request_arriving_while_a_preload_starts_the_group_waits_and_is_cold(
    pw: PersistentWorkerExecutor,
) -> None:
    group = pw.group(CFG2)
    assert group is not None and CFG2 not in pw.loaded_models()  # unloaded by the idle test
    assignment = cfg2_assignment()
    preload = threading.Thread(target=pw.preload_sync, args=(assignment.model,))
    preload.start()
    outcome, events = run(pw, assignment)
    preload.join()
    assert outcome.result is not None and outcome.result.report is not None
    report = outcome.result.report
    assert report.cold_start is True and stages(events)[:2] == ["load:start", "load:end"]
    [load] = [timing for timing in report.timings if timing.name == "load"]
    # It is charged what it waited for, from its arrival: not the part of the start before it.
    assert load.start_offset_ms >= 0 and load.duration_ms > 0
    seen_pids.extend(group.pids())


def test_close_leaves_no_group_process(pw: PersistentWorkerExecutor) -> None:
    # A live group stopped by the worker's SIGTERM is checked through real daemons
    # (tests/integration/test_persistent_worker.py); here: every group ever started is gone.
    pw.close_sync()
    assert pw.loaded_models() == []
    assert seen_pids and not [p for p in seen_pids if pid_alive(p)]
