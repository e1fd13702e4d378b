"""persistent_worker's data-parallel program: a batch split across a real 2-rank torchrun group.

One group is shared by the tests of this module (a start costs seconds); the last test closes it.
"""

from __future__ import annotations

import functools
import io
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
from omnirt.worker.modes.persistent.data_parallel import share_of
from omnirt.worker.modes.persistent.executor import PersistentWorkerExecutor

DP2 = "tiny-sd-dp2"
RUNTIME = {"nproc_per_node": 2.0, "program": "data_parallel"}
# Each rank batches its share (and the guidance halves) where the reference runs one job at a
# time: float rounding of batched kernels, amplified by 4 steps and the VAE, may move a pixel
# by a uint8 step or two; a wrong seed or prompt moves it by tens.
MAX_PIXEL_DIFF = 3


@pytest.fixture(scope="module")
def pw(model_dir: Path) -> Iterator[PersistentWorkerExecutor]:
    executor = PersistentWorkerExecutor(
        WorkerConfig(mode="persistent_worker", model_dir=str(model_dir), worker_id="w-dp", torch_threads=1)
    )
    yield executor
    executor.close_sync()


def dp_assignment(job_ids: tuple[str, ...], **kwargs: object) -> Assignment:
    assignment = make_assignment(model_id=DP2, job_ids=job_ids, **kwargs)  # type: ignore[arg-type]
    assignment.model.runtime = dict(RUNTIME)
    return assignment


def run(
    executor: PersistentWorkerExecutor, assignment: Assignment, cancel: str = ""
) -> tuple[list[ItemOutcome], list[t.JobEvent]]:
    flags = CancelFlags()
    events: list[t.JobEvent] = []

    def emit(event: t.JobEvent) -> None:
        events.append(event)
        if cancel and event.job_id == cancel and event.progress and event.progress.step == 2:
            flags.request(cancel)

    return executor.run_sync(assignment, emit, flags), events


def images(outcome: ItemOutcome) -> list[np.ndarray]:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return [
        np.asarray(Image.open(io.BytesIO(a.data)).convert("RGB")).astype(int)
        for a in outcome.result.artifacts
    ]


@functools.cache
def pipeline(model_dir: Path) -> Any:
    import diffusers

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(model_dir: Path, index: int, seeds: list[int]) -> list[np.ndarray]:
    """What StableDiffusionPipeline makes for job `index` of make_assignment alone, in this process."""
    import torch

    out = pipeline(model_dir)(
        prompt=f"a watercolor fox number {index}",
        negative_prompt="blurry",
        width=64,
        height=64,
        num_inference_steps=4,
        guidance_scale=5.0,
        num_images_per_prompt=len(seeds),
        generator=[torch.Generator("cpu").manual_seed(seed) for seed in seeds],
    ).images
    return [np.asarray(image.convert("RGB")).astype(int) for image in out]


def test_outputs_are_cut_into_contiguous_shares_with_the_extra_ones_on_the_lower_ranks() -> None:
    outputs = [(0, 0), (0, 1), (1, 0), (2, 0), (2, 1)]
    assert [share_of(outputs, r, 2) for r in range(2)] == [outputs[:3], outputs[3:]]
    assert [len(share_of(outputs, r, 3)) for r in range(3)] == [2, 2, 1]
    assert [share_of(outputs[:1], r, 2) for r in range(2)] == [outputs[:1], []]


def test_a_batch_is_split_across_the_ranks_and_matches_the_pipeline(
    pw: PersistentWorkerExecutor, model_dir: Path
) -> None:
    outcomes, events = run(pw, dp_assignment(("a", "b", "c")))
    reports = [o.result.report for o in outcomes if o.result and o.result.report]
    assert len(reports) == 3
    config = reports[0].config_resolved
    assert config["program"] == "data_parallel" and config["nproc_per_node"] == 2
    assert config["outputs_per_rank"] == [2, 1], "3 outputs on 2 ranks"
    assert {r.batch_size for r in reports} == {3}
    assert len({r.timing("denoise") for r in reports}) == 1, "one request for the batch"
    for job_id in ("a", "b", "c"):
        steps = [e.progress.step for e in events if e.job_id == job_id and e.progress]
        assert steps == [1, 2, 3, 4]
    for index, outcome in enumerate(outcomes):
        [ours] = images(outcome)
        [theirs] = reference(model_dir, index, [7 + 100 * index])
        diff = np.abs(ours - theirs).max()
        assert diff <= MAX_PIXEL_DIFF, f"job {index} differs from the pipeline by {diff}/255"

    # One job of two outputs: one output per rank, in seed order.
    [outcome], _ = run(pw, dp_assignment(("d",), num_outputs=2))
    assert outcome.result is not None and outcome.result.report is not None
    assert outcome.result.report.config_resolved["outputs_per_rank"] == [1, 1]
    for ours, theirs in zip(images(outcome), reference(model_dir, 0, [7, 8]), strict=True):
        assert np.abs(ours - theirs).max() <= MAX_PIXEL_DIFF
    # A single output leaves rank 1 idle; it still follows every step.
    [outcome], _ = run(pw, dp_assignment(("e",)))
    assert outcome.result is not None and outcome.result.report is not None
    assert outcome.result.report.config_resolved["outputs_per_rank"] == [1, 0]


def test_a_job_cancelled_inside_a_batch_is_dropped_and_the_others_are_unchanged(
    pw: PersistentWorkerExecutor,
) -> None:
    batch = ("x", "y", "z")
    reference_run, _ = run(pw, dp_assignment(batch, steps=6))
    outcomes, _ = run(pw, dp_assignment(batch, steps=6), cancel="y")
    by_id = {o.job_id: o for o in outcomes}
    assert by_id["y"].error is not None and by_id["y"].error.code == "CANCELLED"
    for expected in (reference_run[0], reference_run[2]):
        got = by_id[expected.job_id]
        assert got.result is not None and expected.result is not None
        assert got.result.artifacts[0].data == expected.result.artifacts[0].data


def test_bad_requests_are_refused_and_the_group_keeps_serving(
    pw: PersistentWorkerExecutor,
) -> None:
    bad = dp_assignment(("p", "q"))
    for item in bad.items:
        item.request.width = 60
    outcomes, _ = run(pw, bad)
    assert [(o.error.code, o.error.field) for o in outcomes if o.error] == [("INVALID_ARGUMENT", "width")] * 2
    adapted = dp_assignment(("s",))
    adapted.items[0].request.adapters = [t.Adapter("loras/fox", 1.0)]
    [refused], _ = run(pw, adapted)
    assert refused.error is not None and (refused.error.code, refused.error.field) == (
        "INVALID_ARGUMENT",
        "adapters",
    )
    [good], _ = run(pw, dp_assignment(("r",)))
    assert good.error is None
    pw.close_sync()
    assert pw.loaded_models() == []
