"""persistent_worker's pipeline program: any family through its own `__call__` on real 2-rank groups.

Two groups, shared by the tests of this module in file order (a start costs seconds): tiny SD3
(batched guidance: one transformer call per step on [uncond, cond]) and tiny Wan (sequential
guidance: two calls per step, cond then uncond), then Wan again with Ulysses context parallel
(a load-time setting: a new group). Every output is compared with what legacy_call makes in
this process for the same request and seed.

Tolerance: outputs equal legacy_call's within 2/255 per pixel (images) or per produced frame
value (videos): the split runs a batch of N where the pipeline runs 2N, and batched kernels may
sum in another order (about 1e-7 relative), which a few steps and the VAE amplify to at most a
step of the uint8 rounding; a wrong half, a swapped cond/uncond or a misaligned seed moves
pixels by tens (a swapped half: 79/255 for SD3, 216/255 for Wan). Measured here: at most 1/255
for SD3 (guidance split and data parallel; often the same bytes), 0 for Wan (guidance split:
the same MP4 bytes; Ulysses: the same frames). Data parallel is tested on SD3's PNGs: a video's
MP4 turns the batch-size rounding (under 0.001/255 in the raw frames) into a few levels.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import TASKS, Family, only_result, pixels, produced_frames, refusal, run_family

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.persistent.executor import PersistentWorkerExecutor
from omnirt.worker.modes.persistent.launch import GroupError, launch_spec

MAX_DIFF = 2
SD3 = Family(
    "tiny-sd3",
    "StableDiffusion3Pipeline",
    (t.Task.TEXT2IMAGE,),
    {"width": 64, "height": 64, "num_inference_steps": 3, "guidance_scale": 5.0, "seed": 7},
)
WAN = Family(
    "tiny-wan",
    "WanPipeline",
    (t.Task.TEXT2VIDEO,),
    {"width": 64, "height": 64, "num_frames": 9, "num_inference_steps": 3, "guidance_scale": 5.0, "seed": 7},
)
PROMPT, NEGATIVE = "a red fox", "blurry"
CFG2 = {"nproc_per_node": 2.0, "parallel": "cfg", "restart_backoff_s": 0.2}


@pytest.fixture(scope="module")
def pw(model_dir: Path) -> Iterator[PersistentWorkerExecutor]:
    executor = PersistentWorkerExecutor(
        WorkerConfig(mode="persistent_worker", model_dir=str(model_dir), worker_id="w-pf", torch_threads=1)
    )
    yield executor
    executor.close_sync()


def assignment(
    family: Family, runtime: dict[str, Any], job_ids: tuple[str, ...] = ("job-1",), **fields: Any
) -> Assignment:
    """Jobs of `family` on its persistent model `<model>-pw`, shaped like the controller sends them."""
    extra = fields.pop("extra", None)
    model = f"{family.model}-pw"
    msg = gateway_pb2.Assignment(
        assignment_id="as-" + "-".join(job_ids),
        model=models_pb2.ModelSpec(
            id=model,
            source=f"builtin:{family.model}",
            pipeline_class=family.pipeline_class,
            execution_mode="persistent_worker",
            tasks=[TASKS[x] for x in family.tasks],
        ),
        batch_group_id="bg-1" if len(job_ids) > 1 else "",
    )
    for index, job_id in enumerate(job_ids):
        request = types_pb2.GenerateRequest(
            task=TASKS[family.tasks[0]],
            model=model,
            prompt=PROMPT if index == 0 else f"{PROMPT} number {index}",
            negative_prompt=NEGATIVE,
            **{**family.defaults, **fields},
        )
        if extra:
            request.extra.update(extra)
        msg.items.add(job_id=job_id, attempt=1, request=request)
    converted = assignment_from_proto(msg)
    converted.model.runtime = dict(runtime)
    return converted


def run(
    executor: PersistentWorkerExecutor, work: Assignment, cancel_at: int = 0
) -> tuple[list[ItemOutcome], list[t.JobEvent]]:
    flags = CancelFlags()
    events: list[t.JobEvent] = []

    def emit(event: t.JobEvent) -> None:
        events.append(event)
        if cancel_at and event.progress and event.progress.step == cancel_at:
            flags.request(event.job_id)

    return executor.run_sync(work, emit, flags), events


def legacy(executor: LegacyCallExecutor, family: Family, **fields: Any) -> t.GenerateResult:
    """What legacy_call makes in this process for the same request."""
    return only_result(run_family(executor, family, prompt=PROMPT, negative_prompt=NEGATIVE, **fields))


def frames(result: t.GenerateResult) -> np.ndarray:
    return produced_frames(result.artifacts[0]).astype(np.float32)


def split_stats(result: t.GenerateResult) -> list[dict[str, Any]]:
    return list(result.report.config_resolved["guidance_split"])


def test_batched_guidance_is_halved_across_the_ranks_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    ours = only_result(run(pw, assignment(SD3, CFG2))[0])
    theirs = legacy(executor, SD3)
    assert ours.report.pipeline_class == "StableDiffusion3Pipeline"
    config = ours.report.config_resolved
    assert (config["program"], config["parallel"], config["cfg_parallel"]) == ("pipeline", "cfg", True)
    assert (ours.artifacts[0].width, ours.artifacts[0].height) == (64, 64)
    diff = np.abs(pixels(ours.artifacts[0]) - pixels(theirs.artifacts[0])).max()
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"
    # Step 1 runs whole on both ranks (the hook reads the pattern), then each rank computes one
    # of the two halves: 2 + 1 + 1 samples of the 6 the unsplit pipeline runs.
    steps = SD3.defaults["num_inference_steps"]
    for rank in split_stats(ours):
        assert rank["pattern"] == "batched"
        assert rank["denoiser_calls"] == steps
        assert rank["computed_samples"] == 2 + (steps - 1), rank


def test_sequential_guidance_gives_each_rank_one_of_the_two_calls_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    ours = only_result(run(pw, assignment(WAN, CFG2))[0])
    theirs = legacy(executor, WAN)
    assert ours.report.pipeline_class == "WanPipeline"
    assert ours.artifacts[0].num_frames == 9 and ours.report.config_resolved["num_frames"] == 9
    diff = np.abs(frames(ours) - frames(theirs)).max()
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"
    # Step 1: both calls on both ranks; then rank 0 the cond call, rank 1 the uncond one.
    steps = WAN.defaults["num_inference_steps"]
    for rank in split_stats(ours):
        assert rank["pattern"] == "sequential"
        assert rank["denoiser_calls"] == 2 * steps
        assert rank["computed_calls"] == 2 + (steps - 1), rank


def test_without_guidance_rank_0_computes_and_rank_1_receives(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    ours = only_result(run(pw, assignment(SD3, CFG2, guidance_scale=1.0))[0])
    theirs = legacy(executor, SD3, guidance_scale=1.0)
    assert np.abs(pixels(ours.artifacts[0]) - pixels(theirs.artifacts[0])).max() <= MAX_DIFF
    steps = SD3.defaults["num_inference_steps"]
    rank0, rank1 = split_stats(ours)
    assert rank0["pattern"] == rank1["pattern"] == "single"
    assert ours.report.config_resolved["cfg_parallel"] is False
    assert (rank0["computed_calls"], rank1["computed_calls"]) == (steps, 1), "rank 1: step 1 only"


def test_data_parallel_makes_one_output_per_rank_through_the_pipeline(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    data = {**CFG2, "parallel": "data"}  # same launch: the running SD3 group takes it
    ours = only_result(run(pw, assignment(SD3, data, num_outputs=2))[0])
    theirs = legacy(executor, SD3, num_outputs=2)
    config = ours.report.config_resolved
    assert (config["parallel"], config["outputs_per_rank"], config["seeds"]) == ("data", [1, 1], [7, 8])
    assert "guidance_split" not in config and config["cfg_parallel"] is False
    assert len(ours.artifacts) == 2
    for mine, reference in zip(ours.artifacts, theirs.artifacts, strict=True):
        diff = np.abs(pixels(mine) - pixels(reference)).max()
        assert diff <= MAX_DIFF, f"output differs from legacy_call by {diff}/255"
    assert np.abs(pixels(ours.artifacts[0]) - pixels(ours.artifacts[1])).max() > 10 * MAX_DIFF


def test_a_batch_of_two_jobs_shares_one_guided_call(pw: PersistentWorkerExecutor) -> None:
    outcomes, _ = run(pw, assignment(SD3, CFG2, job_ids=("a", "b")))
    results = [only_result(o) for o in outcomes]
    for result in results:
        assert result.report.batch_size == 2
        # N = 2 outputs: batch 4 at step 1, then a half of 2 per rank.
        assert [r["computed_samples"] for r in split_stats(result)] == [4 + 2 * 2] * 2
    assert results[0].artifacts[0].data != results[1].artifacts[0].data, "two prompts, two seeds"


def test_a_models_preview_option_sends_rank_0s_previews_of_each_job(pw: PersistentWorkerExecutor) -> None:
    """`runtime.preview` (not a launch setting: the running SD3 group takes it): rank 0 makes a
    preview of each job's latents between the steps and sends it with the step's progress."""
    runtime = {**CFG2, "preview": {"every_steps": 1, "max_size": 32}}
    outcomes, events = run(pw, assignment(SD3, runtime, job_ids=("a", "b")))
    for outcome in outcomes:
        only_result([outcome])
    for job_id in ("a", "b"):
        previews = [e for e in events if e.kind is t.EventKind.PREVIEW and e.job_id == job_id]
        assert [e.progress.step for e in previews if e.progress] == [1, 2], job_id  # never the last (3)
        image = Image.open(io.BytesIO(previews[-1].preview))
        assert (image.format, image.size) == ("JPEG", (32, 32)), job_id
    first = {e.job_id: e.preview for e in events if e.kind is t.EventKind.PREVIEW and e.progress.step == 2}
    assert first["a"] != first["b"], "each job's own latents"
    quiet = run(pw, assignment(SD3, CFG2))[1]
    assert not [e for e in quiet if e.kind is t.EventKind.PREVIEW], "off by default"


def test_fields_the_family_cannot_take_are_invalid_argument_naming_them(pw: PersistentWorkerExecutor) -> None:
    [odd], _ = run(pw, assignment(SD3, CFG2, width=72))  # SD3: multiples of 16
    assert refusal(odd) == ("INVALID_ARGUMENT", "width")
    [foreign], _ = run(pw, assignment(SD3, CFG2, extra={"true_cfg_scale": 4.0}))  # Flux's, not SD3's
    assert refusal(foreign) == ("INVALID_ARGUMENT", "extra.true_cfg_scale")
    # Checked before the call, job by job, on every rank: the batch's ranks agree and keep serving.
    outcomes, _ = run(pw, assignment(SD3, CFG2, job_ids=("p", "q"), extra={"max_sequence_length": "x"}))
    assert [refusal(o) for o in outcomes] == [("INVALID_ARGUMENT", "extra.max_sequence_length")] * 2
    [good], _ = run(pw, assignment(SD3, CFG2))
    assert good.error is None


def test_a_cancel_at_a_step_stops_every_rank_and_the_group_keeps_serving(
    pw: PersistentWorkerExecutor,
) -> None:
    [stopped], events = run(pw, assignment(SD3, CFG2, num_inference_steps=5), cancel_at=2)
    assert stopped.error is not None and stopped.error.code == "CANCELLED"
    assert [e.progress.step for e in events if e.progress] == [1, 2]
    [again], events = run(pw, assignment(SD3, CFG2))
    assert only_result(again).report.cold_start is False
    assert [e.progress.step for e in events if e.progress] == [1, 2, 3]


def test_ulysses_splits_the_sequence_on_gloo_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    ulysses = {**CFG2, "parallel": "ulysses"}  # applied at load: the Wan group is replaced
    ours = only_result(run(pw, assignment(WAN, ulysses))[0])
    assert ours.report.cold_start is True
    assert ours.report.config_resolved["parallel"] == "ulysses"
    # Each rank's attention took its half of the tokens: 9 frames are 3 latent frames of 8x8,
    # (1, 2, 2) patches make 3 x 4 x 4 = 48 tokens. An unsplit call (the same frames) shows 48.
    tokens = 3 * (64 // 8 // 2) * (64 // 8 // 2)
    world = int(CFG2["nproc_per_node"])
    assert ours.report.config_resolved["context_parallel"] == [{"tokens": tokens // world}] * world
    diff = np.abs(frames(ours) - frames(legacy(executor, WAN))).max()
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"


HV15 = Family(
    "tiny-hunyuan-video15",
    "HunyuanVideo15Pipeline",
    (t.Task.TEXT2VIDEO,),
    {"width": 32, "height": 32, "num_frames": 5, "fps": 8.0, "num_inference_steps": 3, "seed": 7},
)


def test_a_pipeline_without_a_step_callback_splits_guidance_and_reports_its_steps(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    # HunyuanVideo 1.5 takes no callback_on_step_end: its progress bar's update ends a step, so
    # the guider's two calls per step (cond, uncond) are split from step 2 and steps are reported.
    [outcome], events = run(pw, assignment(HV15, CFG2))
    ours = only_result(outcome)
    assert [e.progress.step for e in events if e.progress] == [1, 2, 3]
    steps = HV15.defaults["num_inference_steps"]
    for rank in split_stats(ours):
        assert rank["pattern"] == "sequential", rank
        assert rank["computed_calls"] == 2 + (steps - 1), rank
    diff = np.abs(frames(ours) - frames(legacy(executor, HV15))).max()
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"


def test_settings_refuse_what_the_group_cannot_run(pw: PersistentWorkerExecutor) -> None:
    spec = assignment(WAN, {**CFG2, "parallel": "ring"}).model
    with pytest.raises(GroupError) as ring:
        launch_spec(spec, "cpu", pw.config)
    assert ring.value.code == "FAILED_PRECONDITION" and "runtime.parallel 'ring'" in str(ring.value)
    for runtime, named in (
        ({**CFG2, "parallel": "tensor"}, "runtime.parallel"),
        ({**CFG2, "program": "data_parallel"}, "runtime.parallel"),
        ({"parallel": "ulysses"}, "runtime.nproc_per_node"),
    ):
        with pytest.raises(GroupError) as refused:
            launch_spec(assignment(SD3, runtime).model, "cpu", pw.config)
        assert refused.value.code == "FAILED_PRECONDITION" and named in str(refused.value)
