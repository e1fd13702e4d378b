"""The `modular` mode on diffusers' own Modular Diffusers blocks: tiny SDXL and tiny Flux.

Stages and their events, legacy_call parity, the prompt cache, one ComponentsManager holding each
module once, cancel per step, batches, and the families the mode refuses before loading them.
"""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    MASK,
    Family,
    make_assignment,
    noise_image,
    only_result,
    pixels,
    png_bytes,
    produced_frames,
    refusal,
    run_assignment,
    run_family,
)

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular.block_fixes import apply_block_fixes
from omnirt.worker.modes.modular.executor import ModularExecutor
from omnirt.worker.modes.modular.families import modular_family, supports_modular

SIZE = {"width": 64, "height": 64, "num_inference_steps": 4, "seed": 7}
SDXL = Family(
    "tiny-sdxl",
    "StableDiffusionXLPipeline",
    (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT),
    {**SIZE, "guidance_scale": 5.0},
)
FLUX = Family(
    "tiny-flux", "FluxPipeline", (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE), {**SIZE, "guidance_scale": 3.5}
)
VIDEO = {"width": 32, "height": 32, "num_inference_steps": 3, "seed": 7}
SD3 = Family("tiny-sd3", "StableDiffusion3Pipeline", (t.Task.TEXT2IMAGE,), {**SIZE, "guidance_scale": 5.0})
WAN = Family(
    "tiny-wan", "WanPipeline", (t.Task.TEXT2VIDEO,), {**VIDEO, "num_frames": 5, "guidance_scale": 5.0}
)
LTX = Family(
    "tiny-ltx-video",
    "LTXPipeline",
    (t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO),
    {**VIDEO, "num_frames": 9, "guidance_scale": 3.0},
)
COGVIDEOX = Family("tiny-cogvideox", "CogVideoXPipeline", (t.Task.TEXT2VIDEO,), {"num_frames": 9})


def half_mask() -> Image.Image:
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half
    return mask


INPUTS = {
    t.Task.TEXT2IMAGE: (),
    t.Task.IMAGE2IMAGE: ((IMAGE, png_bytes(noise_image(1))),),
    t.Task.INPAINT: ((IMAGE, png_bytes(noise_image(2))), (MASK, png_bytes(half_mask()))),
}


@pytest.fixture(scope="module")
def modular(model_dir: Path, executor: LegacyCallExecutor) -> ModularExecutor:
    """A modular executor on the legacy executor's model cache (the same loaded modules), with
    every event handed over at once (the cancel test acts on a step while the run goes on)."""
    config = WorkerConfig(
        mode="modular", model_dir=str(model_dir), worker_id="w-mod", torch_threads=1, progress_interval_ms=0
    )
    return ModularExecutor(config, cache=executor.cache)


@pytest.mark.parametrize(
    ("family", "pipeline_class"), [(SDXL, "StableDiffusionXLModularPipeline"), (FLUX, "FluxModularPipeline")]
)
def test_each_stage_is_an_event_pair_and_a_timing_with_one_progress_per_step(
    modular: ModularExecutor, family: Family, pipeline_class: str
) -> None:
    outcome = run_family(modular, family, prompt="stage timings", num_inference_steps=3)
    report = only_result(outcome).report
    assert report is not None
    assert (report.execution_mode, report.pipeline_class) == ("modular", pipeline_class)
    blocks = modular_family(family.pipeline_class)
    assert blocks is not None
    assert report.config_resolved["modular_blocks"] == blocks.blocks
    assert report.config_resolved["workflow"] == "text2image"
    assert [x.name for x in report.timings if x.name != "load"] == ["encode", "denoise", "decode", "export"]
    assert report.config_resolved["num_inference_steps"] == 3
    # The events, as the daemon receives them.
    [_outcome], events = run_assignment(modular, _assignment(family, "stage events", num_inference_steps=3))
    stages = [
        (e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE and e.stage != "load"
    ]
    assert stages == [(s, f) for s in ("encode", "denoise", "decode", "export") for f in (False, True)]
    steps = [e.progress.step for e in events if e.kind is t.EventKind.PROGRESS and e.progress]
    assert steps == [1, 2, 3]


def _assignment(family: Family, prompt: str, **fields: object):  # type: ignore[no-untyped-def]
    """One text-to-image job on `family` (seed 7, 64x64) as the controller sends it."""
    base = make_assignment(source=f"builtin:{family.model}", model_id=family.model, seed=7)
    item = base.items[0]
    values = {"prompt": prompt, "negative_prompt": "", **fields}
    if "guidance_scale" in family.defaults:
        values.setdefault("guidance_scale", family.defaults["guidance_scale"])
    request = dataclasses.replace(item.request, **values)  # type: ignore[arg-type]
    model = dataclasses.replace(base.model, pipeline_class=family.pipeline_class, execution_mode="modular")
    return dataclasses.replace(base, model=model, items=[dataclasses.replace(item, request=request)])


@pytest.mark.parametrize(
    ("family", "task", "fields", "tolerance"),
    [
        (SDXL, t.Task.TEXT2IMAGE, {}, 1),
        (SDXL, t.Task.IMAGE2IMAGE, {}, 1),
        # The block fix `sdxl_inpaint_generator_order`: the pipeline's draws, in its order.
        (SDXL, t.Task.INPAINT, {}, 1),
        (SDXL, t.Task.INPAINT, {"strength": 0.6}, 1),
        (FLUX, t.Task.TEXT2IMAGE, {}, 0),
        (FLUX, t.Task.IMAGE2IMAGE, {}, 0),
    ],
)
def test_the_same_request_gives_the_image_legacy_call_gives(
    modular: ModularExecutor,
    executor: LegacyCallExecutor,
    family: Family,
    task: t.Task,
    fields: dict[str, float],
    tolerance: int,
) -> None:
    ours = only_result(run_family(modular, family, task, inputs=INPUTS[task], seed=11, **fields))
    theirs = only_result(run_family(executor, family, task, inputs=INPUTS[task], seed=11, **fields))
    assert ours.report is not None and theirs.report is not None
    assert (
        ours.report.config_resolved["num_inference_steps"]
        == theirs.report.config_resolved["num_inference_steps"]
    )
    difference = np.abs(pixels(ours.artifacts[0]) - pixels(theirs.artifacts[0]))
    # Flux: the same computation. SDXL: its guider runs the conditional and unconditional UNet
    # passes as two batches of 1 where the pipeline runs one batch of 2 (float32 sums in another
    # order): at most 1/255 on a handful of pixels.
    assert difference.max() <= tolerance
    assert (difference > 0).mean() < 0.01


def test_the_sdxl_inpaint_fix_changes_that_instance_only() -> None:
    import diffusers

    encoder, latents = "vae_encoder", "denoise.before_denoise.prepare_latents"
    fixed = diffusers.StableDiffusionXLAutoBlocks().get_workflow("inpainting")
    assert apply_block_fixes("StableDiffusionXLAutoBlocks", fixed) == ["sdxl_inpaint_generator_order"]
    fresh = diffusers.StableDiffusionXLAutoBlocks().get_workflow("inpainting")
    for name in (encoder, latents):
        assert type(fresh.sub_blocks[name]).__module__.startswith("diffusers.")
        assert type(fixed.sub_blocks[name]).__module__.startswith("omnirt.")
    other = diffusers.StableDiffusionXLAutoBlocks().get_workflow("image2image")
    assert apply_block_fixes("StableDiffusionXLAutoBlocks", other) == []


@pytest.mark.parametrize(
    ("family", "task"),
    [(SD3, t.Task.TEXT2IMAGE), (WAN, t.Task.TEXT2VIDEO), (LTX, t.Task.TEXT2VIDEO), (LTX, t.Task.IMAGE2VIDEO)],
)
def test_sd3_wan_and_ltx_blocks_make_what_legacy_call_makes(
    modular: ModularExecutor, executor: LegacyCallExecutor, family: Family, task: t.Task
) -> None:
    inputs = ((IMAGE, png_bytes(noise_image(5, (32, 32)))),) if task is t.Task.IMAGE2VIDEO else ()
    ours = only_result(run_family(modular, family, task, inputs=inputs, negative_prompt="blurry"))
    theirs = only_result(run_family(executor, family, task, inputs=inputs, negative_prompt="blurry"))
    assert ours.report is not None and ours.report.pipeline_class.endswith("ModularPipeline")
    if t.Task(task).value.endswith("video"):
        made, expected = (produced_frames(r.artifacts[0]).astype(np.int16) for r in (ours, theirs))
        assert made.shape[0] == family.defaults["num_frames"]
    else:
        made, expected = pixels(ours.artifacts[0]), pixels(theirs.artifacts[0])
    assert made.shape == expected.shape
    assert np.abs(made - expected).max() <= 1


@pytest.mark.parametrize("task", SDXL.tasks)
def test_same_seed_same_bytes_other_seed_other_bytes(modular: ModularExecutor, task: t.Task) -> None:
    first = only_result(run_family(modular, SDXL, task, inputs=INPUTS[task], seed=3)).artifacts[0]
    again = only_result(run_family(modular, SDXL, task, inputs=INPUTS[task], seed=3)).artifacts[0]
    other = only_result(run_family(modular, SDXL, task, inputs=INPUTS[task], seed=4)).artifacts[0]
    assert (first.width, first.height) == (64, 64)
    assert first.data == again.data
    assert first.data != other.data
    if task is t.Task.INPAINT:  # the left half is kept from the input image
        kept = np.asarray(noise_image(2).convert("RGB"), dtype=np.float32)[:, :32]
        assert np.abs(pixels(first)[:, :32] - kept).max() <= 1


def test_a_repeated_prompt_skips_the_text_encoders(modular: ModularExecutor) -> None:
    encoders = [modular.modular.components(name)[0] for name in ("text_encoder", "text_encoder_2")]
    calls: list[str] = []
    hooks = [e.register_forward_hook(lambda *_: calls.append("encoder")) for e in encoders]
    try:
        first = only_result(run_family(modular, SDXL, prompt="a cached lighthouse", seed=1)).report
        encoded = len(calls)
        second = only_result(run_family(modular, SDXL, prompt="a cached lighthouse", seed=2)).report
        hit_calls = len(calls) - encoded
        unguided = only_result(
            run_family(modular, SDXL, prompt="a cached lighthouse", guidance_scale=1.0)
        ).report
    finally:
        for hook in hooks:
            hook.remove()
    assert first is not None and second is not None and unguided is not None
    assert encoded > 0 and hit_calls == 0  # the second job never ran a text encoder
    assert (first.cache_hits, second.cache_hits) == ({"prompt_embeds": 0}, {"prompt_embeds": 1})
    assert unguided.cache_hits == {"prompt_embeds": 0}  # guidance off: no negative half, other embeddings
    assert (second.timing("encode") or 0.0) < (first.timing("encode") or 0.0)


def test_the_three_sdxl_tasks_and_both_families_hold_each_module_once(modular: ModularExecutor) -> None:
    for task in SDXL.tasks:
        only_result(run_family(modular, SDXL, task, inputs=INPUTS[task]))
    only_result(run_family(modular, FLUX))
    manager = modular.modular
    # One ComponentsManager: SDXL's three task pipelines share one collection and in it one UNet,
    # VAE and pair of text encoders, the very modules the model cache loaded.
    loaded = modular.components(_assignment(SDXL, "x").model, t.Task.TEXT2IMAGE)
    [sdxl] = [ids for name, ids in manager.manager.collections.items() if "tiny-sdxl" in name]
    held = {component_id.rsplit("_", 1)[0]: manager.manager.components[component_id] for component_id in sdxl}
    assert sorted(held) == sorted(n for n, c in loaded.items() if c is not None)
    assert all(held[name] is loaded[name] for name in held)
    assert manager.components("unet") == [loaded["unet"]]  # the only UNet of the worker
    [flux] = [ids for name, ids in manager.manager.collections.items() if "tiny-flux" in name]
    assert len(flux) == 7  # two encoders, two tokenizers, transformer, VAE, scheduler: once each


def test_cancel_stops_the_denoising_loop_at_the_next_step(modular: ModularExecutor) -> None:
    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.progress and event.progress.step == 2:
            flags.request(event.job_id)

    [outcome], events = run_assignment(
        modular, _assignment(SDXL, "a long run", num_inference_steps=30), on_event=cancel_at_step_2
    )
    assert outcome.error is not None and outcome.error.code == "CANCELLED"
    steps = [e.progress.step for e in events if e.kind is t.EventKind.PROGRESS and e.progress]
    assert 2 <= len(steps) <= 3  # the flag is read at the end of each step
    assert not any(e.stage == "decode" for e in events if e.kind is t.EventKind.STAGE)
    only_result(run_family(modular, SDXL, num_inference_steps=1))  # and it keeps serving


def test_a_batch_is_one_pass_and_each_job_matches_its_own_run(modular: ModularExecutor) -> None:
    batch = make_assignment(job_ids=("b-1", "b-2"), source="builtin:tiny-sdxl", model_id="tiny-sdxl")
    batch = dataclasses.replace(
        batch, model=dataclasses.replace(batch.model, pipeline_class=SDXL.pipeline_class)
    )
    outcomes, _ = run_assignment(modular, batch)
    reports = [only_result(o).report for o in outcomes]
    assert all(r is not None for r in reports)
    # One denoising loop for both jobs: the same stage, timed once.
    assert reports[0].timing("denoise") == reports[1].timing("denoise")  # type: ignore[union-attr]
    for item, outcome in zip(batch.items, outcomes, strict=True):
        alone = dataclasses.replace(batch, items=[item], batch_group_id="")
        [single], _ = run_assignment(modular, alone)
        together = pixels(only_result(outcome).artifacts[0])
        assert np.abs(together - pixels(only_result(single).artifacts[0])).max() <= 3


def test_what_the_blocks_cannot_do_is_refused_naming_the_field(modular: ModularExecutor) -> None:
    # Flux's blocks take no negative prompt (legacy_call passes it on to a pipeline that ignores it).
    code, field = refusal(run_family(modular, FLUX, negative_prompt="blurry"))
    assert (code, field) == ("INVALID_ARGUMENT", "negative_prompt")
    # diffusers has a Flux inpainting pipeline, but no inpainting workflow in Flux's blocks.
    code, field = refusal(run_family(modular, FLUX, t.Task.INPAINT, inputs=INPUTS[t.Task.INPAINT]))
    assert (code, field) == ("FAILED_PRECONDITION", "task")


def test_a_family_without_modular_blocks_is_refused_before_it_loads(tmp_path: Path) -> None:
    # A worker of its own: nothing built or loaded yet, so "before it loads" can be seen.
    fresh = ModularExecutor(WorkerConfig(mode="modular", model_dir=str(tmp_path), torch_threads=1))
    outcome = run_family(fresh, COGVIDEOX)
    assert refusal(outcome) == ("FAILED_PRECONDITION", "model")
    assert outcome.error is not None
    assert "tiny-cogvideox" in outcome.error.message and "modular" in outcome.error.message
    assert len(fresh.cache) == 0
    assert not (tmp_path / "tiny-cogvideox").exists()  # never even built


def test_the_family_table_is_pure_and_says_what_runs() -> None:
    assert supports_modular("StableDiffusionXLPipeline", t.Task.INPAINT)
    assert supports_modular("FluxPipeline", t.Task.TEXT2IMAGE)
    assert not supports_modular("FluxPipeline", t.Task.INPAINT)
    assert supports_modular("StableDiffusionPipeline")  # OmniRT's composed stages
    assert not supports_modular("CogVideoXPipeline")
    code = (
        "import sys, omnirt.worker.modes.modular.families as f; "
        "assert f.supports_modular('FluxPipeline'); "
        "assert not {'torch', 'diffusers'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("family", [SDXL, FLUX], ids=["sdxl", "flux-packed-latents"])
def test_a_models_preview_option_sends_previews_from_the_blocks_loop(
    modular: ModularExecutor, family: Family
) -> None:
    assignment = _assignment(family, "previews", num_inference_steps=4, width=64, height=48)
    model = dataclasses.replace(assignment.model, runtime={"preview": {"every_steps": 2, "format": "webp"}})
    [outcome], events = run_assignment(modular, dataclasses.replace(assignment, model=model))
    report = only_result([outcome]).report
    assert report is not None
    assert report.config_resolved["runtime_options"]["preview"]["every_steps"] == 2
    previews = [e for e in events if e.kind is t.EventKind.PREVIEW]
    assert [e.progress.step for e in previews if e.progress] == [2], "every 2 steps, never the last"
    (preview,) = previews
    assert preview.preview_mime_type == "image/webp"
    image = Image.open(io.BytesIO(preview.preview))
    assert image.format == "WEBP" and image.size == (64, 48), "the output's size and aspect"
