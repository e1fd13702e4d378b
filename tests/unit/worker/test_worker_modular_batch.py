"""The `modular` mode with batches and LoRA adapters, through its executor.

A batch (an assignment of several jobs) runs as one pass through the stages; jobs with
different adapters run as separate passes; adapters never leak into another job's result nor
into the prompt-embedding cache of jobs without them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular.executor import ModularExecutor

# float32 matmuls over a batch of N and of 1 sum in another order on the CPU (~1e-6 relative);
# after the steps and the VAE that is a couple of uint8 levels at most (as in legacy_call's
# batching test); a wrong seed, prompt or guidance changes pixels by tens of levels.
MAX_BATCH_DIFF = 3


@pytest.fixture(scope="module")
def modular(model_dir: Path) -> ModularExecutor:
    # Events handed to the loop at once: the cancel tests act on a step while the pass runs.
    config = WorkerConfig(
        mode="modular", model_dir=str(model_dir), worker_id="w-mod-b", torch_threads=1, progress_interval_ms=0
    )
    return ModularExecutor(config)


@pytest.fixture(scope="module")
def loras(model_dir: Path) -> dict[str, str]:
    """Two tiny LoRAs under the model dir (an allowed adapter folder): UNet only, and UNet + text encoder."""
    from diffusers import StableDiffusionPipeline

    from omnirt.worker.tiny.lora import build_tiny_lora

    pipeline = StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"))
    build_tiny_lora(pipeline, model_dir / "loras" / "unet-only", seed=1)
    build_tiny_lora(pipeline, model_dir / "loras" / "with-te", seed=2, text_encoder=True)
    return {"unet": "loras/unet-only", "te": "loras/with-te"}


def batch(
    *jobs: dict[str, Any], mode: str = "modular", steps: int = 4, runtime: dict[str, Any] | None = None
) -> Assignment:
    """An assignment of `jobs` (prompt, seed, num_outputs, adapters) on tiny-sd, as the controller sends."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-batch",
        model=models_pb2.ModelSpec(
            id="tiny-sd-modular",
            source="builtin:tiny-sd",
            pipeline_class="StableDiffusionPipeline",
            execution_mode=mode,
            tasks=[types_pb2.TASK_TEXT2IMAGE],
            supports_batching=True,
        ),
        batch_group_id="bg-1" if len(jobs) > 1 else "",
    )
    if runtime:
        msg.model.runtime.update(runtime)
    for index, job in enumerate(jobs):
        request = types_pb2.GenerateRequest(
            task=types_pb2.TASK_TEXT2IMAGE,
            model="tiny-sd-modular",
            prompt=job["prompt"],
            negative_prompt=job.get("negative_prompt", "blurry"),
            width=64,
            height=64,
            num_inference_steps=steps,
            guidance_scale=5.0,
            seed=job.get("seed", 7),
            num_outputs=job.get("num_outputs", 1),
        )
        for name, scale in job.get("adapters", []):
            request.adapters.add(name=name, scale=scale)
        msg.items.add(job_id=job.get("job_id", f"job-{index}"), attempt=1, request=request)
    return assignment_from_proto(msg)


def results(outcomes: list[ItemOutcome]) -> list[t.GenerateResult]:
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
    return [o.result for o in outcomes if o.result is not None]


def report(result: t.GenerateResult) -> t.RunReport:
    assert result.report is not None
    return result.report


def stage(result: t.GenerateResult, name: str) -> tuple[float, float]:
    """(duration, offset from the run's start) of stage `name`."""
    [timing] = [timing for timing in report(result).timings if timing.name == name]
    return timing.duration_ms, timing.start_offset_ms


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.int16)


def alone(executor: LegacyCallExecutor, **job: Any) -> t.GenerateResult:
    [result] = results(run_assignment(executor, batch(job))[0])
    return result


def test_a_batch_runs_as_one_pass_and_each_job_matches_its_unbatched_run(modular: ModularExecutor) -> None:
    jobs = [
        {"prompt": "batch: a red fox", "seed": 10},
        {"prompt": "batch: a blue boat", "seed": 11, "num_outputs": 2},
        {"prompt": "batch: a red fox", "seed": 12},
    ]
    outcomes, events = run_assignment(modular, batch(*jobs))
    batched = results(outcomes)
    reports = [report(r) for r in batched]
    assert {r.batch_size for r in reports} == {3} and {r.batch_group_id for r in reports} == {"bg-1"}
    assert {r.execution_mode for r in reports} == {"modular"}
    assert [r.seeds for r in reports] == [[10], [11, 12], [12]]
    for name in ("encode", "denoise", "decode"):  # one pass: one stage shared by the three jobs
        assert len({stage(r, name) for r in batched}) == 1, name
    # Per prompt: the fox is encoded once, the third job reuses it.
    assert [r.cache_hits for r in reports] == [{"prompt_embeds": h} for h in (0, 0, 1)]
    for job_id in ("job-0", "job-1", "job-2"):
        steps = [e.progress.step for e in events if e.job_id == job_id and e.kind is t.EventKind.PROGRESS]
        assert steps == [1, 2, 3, 4], job_id
    assert [len(r.artifacts) for r in batched] == [1, 2, 1]

    for job, result in zip(jobs, batched, strict=True):
        single = alone(modular, **job)
        assert report(single).batch_size == 1
        for ours, theirs in zip(result.artifacts, single.artifacts, strict=True):
            diff = np.abs(pixels(ours.data) - pixels(theirs.data))
            assert diff.max() <= MAX_BATCH_DIFF and diff.mean() < 0.5, (diff.max(), diff.mean())
    first, second = pixels(batched[0].artifacts[0].data), pixels(batched[2].artifacts[0].data)
    assert np.abs(first - second).mean() > 5, "another seed, another image, inside the batch too"


def test_a_job_cancelled_inside_a_batch_is_dropped_and_the_others_finish_unchanged(
    modular: ModularExecutor,
) -> None:
    jobs = [{"prompt": f"cancel batch {i}", "seed": 20 + i} for i in range(3)]
    reference = results(run_assignment(modular, batch(*jobs, steps=16))[0])

    # Step 1's event reaches the loop at once (progress_interval_ms=0), so the flag is up while
    # up to 15 steps are still to go.
    def cancel_job_1_at_step_1(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.job_id == "job-1" and event.progress and event.progress.step == 1:
            flags.request("job-1")

    outcomes, events = run_assignment(modular, batch(*jobs, steps=16), on_event=cancel_job_1_at_step_1)
    by_id = {o.job_id: o for o in outcomes}
    cancelled = by_id["job-1"].error
    assert cancelled is not None and cancelled.code == "CANCELLED" and "while running" in cancelled.message
    for job_id, expected in (("job-0", reference[0]), ("job-2", reference[2])):
        result = by_id[job_id].result
        assert by_id[job_id].error is None and result is not None
        # The batch kept its rows: the others compute exactly what they would have.
        assert result.artifacts[0].data == expected.artifacts[0].data, job_id
    last = max(e.progress.step for e in events if e.job_id == "job-0" and e.progress)
    assert last == 16


def test_cancelling_every_job_of_a_batch_stops_the_pass(modular: ModularExecutor) -> None:
    def cancel_all_at_step_1(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.progress and event.progress.step == 1:
            flags.request(event.job_id)

    jobs = [{"prompt": f"stop all {i}", "seed": i} for i in range(2)]
    outcomes, events = run_assignment(modular, batch(*jobs, steps=30), on_event=cancel_all_at_step_1)
    assert [o.error.code if o.error else None for o in outcomes] == ["CANCELLED", "CANCELLED"]
    assert max(e.progress.step for e in events if e.progress) < 10


def test_different_adapters_run_as_separate_passes_and_never_leak(
    modular: ModularExecutor, executor: LegacyCallExecutor, loras: dict[str, str]
) -> None:
    plain_job = {"prompt": "a lora fox", "seed": 5}
    plain = alone(modular, **plain_job)
    lora_job = {**plain_job, "adapters": [(loras["unet"], 1.0)], "job_id": "with-lora"}
    outcomes, _ = run_assignment(modular, batch(lora_job, {**plain_job, "job_id": "without"}))
    with_lora, without = results(outcomes)
    assert stage(with_lora, "denoise")[1] != stage(without, "denoise")[1], "two passes"
    assert report(with_lora).config_resolved["adapters"][0]["name"] == loras["unet"]
    assert "adapters" not in report(without).config_resolved
    assert without.artifacts[0].data == plain.artifacts[0].data, "the adapter leaked into its batch mate"
    lora_pixels = pixels(with_lora.artifacts[0].data)
    assert np.abs(lora_pixels - pixels(plain.artifacts[0].data)).mean() > 5, "the adapter changes the image"
    assert alone(modular, **plain_job).artifacts[0].data == plain.artifacts[0].data, (
        "it leaked into a later job"
    )

    # The same adapter in legacy_call (its own loaded copy of tiny-sd) makes the same image.
    legacy = batch(lora_job, mode="legacy_call")
    [theirs] = results(run_assignment(executor, legacy)[0])
    assert np.abs(pixels(theirs.artifacts[0].data) - lora_pixels).max() == 0


def test_a_text_encoder_adapter_keys_the_prompt_cache_and_a_unet_adapter_does_not(
    modular: ModularExecutor, loras: dict[str, str]
) -> None:
    job = {"prompt": "a prompt cached with and without adapters", "seed": 3}

    def run(*adapters: tuple[str, float]) -> tuple[bytes, dict[str, int]]:
        result = alone(modular, **job, adapters=list(adapters))
        return result.artifacts[0].data, report(result).cache_hits

    plain, hits = run()
    assert hits == {"prompt_embeds": 0}
    with_te, hits = run((loras["te"], 1.0))
    assert hits == {"prompt_embeds": 0}, "embeddings made without the text-encoder adapter were reused"
    assert run((loras["te"], 1.0)) == (with_te, {"prompt_embeds": 1})
    assert run((loras["te"], 0.5))[1] == {"prompt_embeds": 0}, "another scale, other embeddings"
    assert run((loras["unet"], 1.0))[1] == {"prompt_embeds": 1}, "a UNet-only adapter embeds like no adapter"
    assert run() == (plain, {"prompt_embeds": 1}), "the plain embeddings stayed plain"
    assert with_te != plain


def test_vae_slicing_from_the_catalog_applies_to_the_decode(modular: ModularExecutor) -> None:
    jobs = [{"prompt": f"sliced {i}", "seed": i} for i in range(2)]
    plain = results(run_assignment(modular, batch(*jobs))[0])
    sliced = results(run_assignment(modular, batch(*jobs, runtime={"enable_vae_slicing": True}))[0])
    for ours, theirs in zip(sliced, plain, strict=True):
        assert report(ours).config_resolved["runtime_options"] == {"enable_vae_slicing": True}
        assert "runtime_options" not in report(theirs).config_resolved
        # One image at a time through the VAE instead of two: the same pixels within rounding.
        diff = np.abs(pixels(ours.artifacts[0].data) - pixels(theirs.artifacts[0].data))
        assert diff.max() <= MAX_BATCH_DIFF


def test_inference_mode_off_in_the_catalog_is_named_as_not_applied(modular: ModularExecutor) -> None:
    jobs = [{"prompt": "stages in inference mode", "seed": 3}]
    [plain] = results(run_assignment(modular, batch(*jobs))[0])
    [asked] = results(run_assignment(modular, batch(*jobs, runtime={"inference_mode": False}))[0])
    assert "inference_mode = false is not applied in the modular mode" in " ".join(report(asked).warnings)
    assert not report(plain).warnings
    assert asked.artifacts[0].data == plain.artifacts[0].data
