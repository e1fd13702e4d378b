"""The `modular` mode on FLUX.2 (`Flux2AutoBlocks`) and Qwen-Image (`QwenImageAutoBlocks`).

Each task against `legacy_call` on the same tiny twin (same request, same seed: the same pixels,
with OmniRT's block fixes), same seed same bytes, the stage events, one ComponentsManager holding
each module once, and what the blocks cannot do refused naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    MASK,
    TASKS,
    Family,
    noise_image,
    only_result,
    pixels,
    png_bytes,
    refusal,
    run_assignment,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular.block_fixes import apply_block_fixes
from omnirt.worker.modes.modular.executor import ModularExecutor
from omnirt.worker.modes.modular.families import modular_family

SIZE: dict[str, Any] = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 4.0, "seed": 7}
FLUX2 = Family("tiny-flux2", "Flux2Pipeline", (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE), SIZE)
QWEN = Family(
    "tiny-qwen-image", "QwenImagePipeline", (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT), SIZE
)
# Over the legacy pipeline's 512 prompt tokens (the blocks' own default is 1024).
LONG_PROMPT = " ".join(["a red fox in the snow"] * 150)


def half_mask() -> Image.Image:
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half
    return mask


INPUTS = {
    t.Task.TEXT2IMAGE: (),
    t.Task.IMAGE2IMAGE: ((IMAGE, png_bytes(noise_image(1))),),
    t.Task.INPAINT: ((IMAGE, png_bytes(noise_image(2))), (MASK, png_bytes(half_mask()))),
}

Run = Callable[..., t.GenerateResult]


@pytest.fixture(scope="module")
def modular(model_dir: Path, executor: LegacyCallExecutor) -> ModularExecutor:
    """A modular executor on the legacy executor's model cache (the same loaded modules)."""
    config = WorkerConfig(
        mode="modular",
        model_dir=str(model_dir),
        worker_id="w-mod-img",
        torch_threads=1,
        progress_interval_ms=0,
    )
    return ModularExecutor(config, cache=executor.cache)


@pytest.fixture(scope="module")
def made(modular: ModularExecutor, executor: LegacyCallExecutor) -> Run:
    """`made(mode, family, task, **fields)`: the result of that job, run once per module (the
    tiny models still take seconds a run on a shared CPU)."""
    results: dict[tuple[object, ...], t.GenerateResult] = {}

    def run(mode: str, family: Family, task: t.Task, **fields: object) -> t.GenerateResult:
        key = (mode, family.model, task, tuple(sorted(fields.items())))
        if key not in results:
            on = modular if mode == "modular" else executor
            results[key] = only_result(run_family(on, family, task, inputs=INPUTS[task], **fields))
        return results[key]

    return run


def test_flux2_blocks_write_the_system_message_the_pipeline_writes_but_for_a_line_break() -> None:
    # Why OmniRT's `flux2_system_message` fix exists (1/255 from legacy_call without it): when
    # diffusers makes the two one, this fails and the fix can go.
    from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE

    blocks = Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE
    assert blocks != SYSTEM_MESSAGE and blocks.split() == SYSTEM_MESSAGE.split()


def test_the_block_fixes_change_only_the_pipelines_own_blocks(made: Run) -> None:
    import diffusers
    from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep
    from diffusers.modular_pipelines.hunyuan_video1_5.before_denoise import HunyuanVideo15PrepareLatentsStep
    from diffusers.modular_pipelines.qwenimage.encoders import QwenImageVaeEncoderStep

    made("modular", FLUX2, t.Task.TEXT2IMAGE, seed=11)
    made("modular", QWEN, t.Task.IMAGE2IMAGE, seed=11)
    # Blocks made afterwards, anywhere in the process, are diffusers' own.
    flux2 = diffusers.Flux2AutoBlocks().get_workflow("text2image").sub_blocks["text_encoder"]
    assert flux2.DEFAULT_SYSTEM_MESSAGE == Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE
    assert "\n" not in flux2.DEFAULT_SYSTEM_MESSAGE
    qwen = diffusers.QwenImageAutoBlocks().get_workflow("image2image").sub_blocks["vae_encoder.encode"]
    assert type(qwen) is QwenImageVaeEncoderStep
    # HunyuanVideo 1.5 image-to-video's fix (its model runs in test_worker_modular_video.py).
    fixed = diffusers.HunyuanVideo15AutoBlocks().get_workflow("image2video")
    assert apply_block_fixes("HunyuanVideo15AutoBlocks", fixed) == ["keep_hunyuan_video15_image_embeds"]
    fresh = diffusers.HunyuanVideo15AutoBlocks().get_workflow("image2video")
    assert type(fresh.sub_blocks["denoise.prepare_latents"]) is HunyuanVideo15PrepareLatentsStep
    assert "image_embeds" in fresh.sub_blocks["denoise.prepare_latents"].intermediate_output_names


@pytest.mark.parametrize(
    ("family", "task", "fields", "tolerance", "changed"),
    [
        # FLUX.2, with the pipeline's system message (`flux2_system_message`; the blocks' own
        # made 1/255 on ~1.2% of the pixels).
        (FLUX2, t.Task.TEXT2IMAGE, {}, 0, 0.0),
        (FLUX2, t.Task.IMAGE2IMAGE, {}, 0, 0.0),
        # Qwen-Image: the same computation, CFG against "" (the request's guidance as true CFG).
        (QWEN, t.Task.TEXT2IMAGE, {}, 0, 0.0),
        (QWEN, t.Task.TEXT2IMAGE, {"negative_prompt": "blurry"}, 0, 0.0),
        (QWEN, t.Task.TEXT2IMAGE, {"guidance_scale": 1.0}, 0, 0.0),
        # No guidance_scale at all: the pipeline's true CFG (4.0) only with a negative prompt.
        (QWEN, t.Task.TEXT2IMAGE, {"guidance_scale": None}, 0, 0.0),
        (QWEN, t.Task.TEXT2IMAGE, {"guidance_scale": None, "negative_prompt": "blurry"}, 0, 0.0),
        # Cut at the pipeline's 512 tokens, not the blocks' 1024 (3/255 apart otherwise).
        (QWEN, t.Task.TEXT2IMAGE, {"prompt": LONG_PROMPT}, 0, 0.0),
        # Image-to-image and inpaint: the image's latents sampled with the request's generator, as
        # the pipelines do (`sample_qwen_image_latents`; the blocks' mean made up to 96/255).
        (QWEN, t.Task.IMAGE2IMAGE, {}, 0, 0.0),
        (QWEN, t.Task.IMAGE2IMAGE, {"strength": 0.8, "negative_prompt": "blurry"}, 0, 0.0),
        (QWEN, t.Task.INPAINT, {}, 0, 0.0),
        (QWEN, t.Task.INPAINT, {"strength": 0.6}, 0, 0.0),
    ],
)
def test_the_same_request_gives_the_image_legacy_call_gives(
    made: Run, family: Family, task: t.Task, fields: dict[str, object], tolerance: int, changed: float
) -> None:
    ours, theirs = (
        made("modular", family, task, seed=11, **fields),
        made("legacy", family, task, seed=11, **fields),
    )
    assert ours.report is not None and theirs.report is not None
    assert ours.report.pipeline_class.endswith("ModularPipeline")
    assert (
        ours.report.config_resolved["num_inference_steps"]
        == theirs.report.config_resolved["num_inference_steps"]
    )
    difference = np.abs(pixels(ours.artifacts[0]) - pixels(theirs.artifacts[0]))
    assert difference.max() <= tolerance
    assert (difference > 0).mean() <= changed


def test_guidance_and_the_negative_prompt_reach_qwen_image_blocks(made: Run) -> None:
    # The guider is Qwen-Image's true CFG: broken, these would make one image.
    first = pixels(made("modular", QWEN, t.Task.TEXT2IMAGE, seed=11).artifacts[0])
    for fields in ({"guidance_scale": 1.0}, {"negative_prompt": "blurry"}):
        other = pixels(made("modular", QWEN, t.Task.TEXT2IMAGE, seed=11, **fields).artifacts[0])
        assert np.abs(first - other).mean() > 0.1, fields


@pytest.mark.parametrize(
    ("family", "task"),
    [
        (FLUX2, t.Task.TEXT2IMAGE),
        (FLUX2, t.Task.IMAGE2IMAGE),
        (QWEN, t.Task.TEXT2IMAGE),
        (QWEN, t.Task.IMAGE2IMAGE),
        (QWEN, t.Task.INPAINT),
    ],
)
def test_same_seed_same_bytes_other_seed_other_bytes(made: Run, family: Family, task: t.Task) -> None:
    first = made("modular", family, task, seed=11).artifacts[0]
    # The same job again (the prompt given, so not the first run's result kept by `made`).
    again = made("modular", family, task, seed=11, prompt="a red fox").artifacts[0]
    other = made("modular", family, task, seed=12).artifacts[0]
    assert (first.width, first.height) == (64, 64)
    assert first.data == again.data
    assert first.data != other.data
    assert np.abs(pixels(first) - pixels(other)).mean() > 1


def test_flux2_image_conditioned_blocks_see_the_image(made: Run) -> None:
    text_only = pixels(made("modular", FLUX2, t.Task.TEXT2IMAGE, seed=11).artifacts[0])
    with_image = pixels(made("modular", FLUX2, t.Task.IMAGE2IMAGE, seed=11).artifacts[0])
    # The reference's 16 tokens of the ~530 the image attends to: a small change, but the seed's.
    assert np.abs(with_image - text_only).mean() > 0.01


def _assignment(family: Family, task: t.Task) -> Assignment:
    """One job of `task` on `family` (seed 7, 2 steps) as the controller sends it, in the modular mode."""
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-{family.model}-{task.value}",
        model=models_pb2.ModelSpec(
            id=family.model,
            source=f"builtin:{family.model}",
            pipeline_class=family.pipeline_class,
            execution_mode="modular",
            tasks=[TASKS[x] for x in family.tasks],
        ),
    )
    request = types_pb2.GenerateRequest(task=TASKS[task], model=family.model, prompt="stage events", **SIZE)
    for role, data in INPUTS[task]:
        request.inputs.add(role=role, data=data)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    return assignment_from_proto(msg)


@pytest.mark.parametrize(
    ("family", "task", "pipeline_class"),
    [
        (FLUX2, t.Task.TEXT2IMAGE, "Flux2ModularPipeline"),
        (FLUX2, t.Task.IMAGE2IMAGE, "Flux2ModularPipeline"),
        (QWEN, t.Task.TEXT2IMAGE, "QwenImageModularPipeline"),
        (QWEN, t.Task.INPAINT, "QwenImageModularPipeline"),
    ],
)
def test_each_stage_is_an_event_pair_and_a_timing_with_one_progress_per_step(
    modular: ModularExecutor, family: Family, task: t.Task, pipeline_class: str
) -> None:
    [outcome], events = run_assignment(modular, _assignment(family, task))
    report = only_result(outcome).report
    assert report is not None
    assert (report.execution_mode, report.pipeline_class, report.task) == ("modular", pipeline_class, task)
    blocks = modular_family(family.pipeline_class)
    assert blocks is not None
    assert report.config_resolved["modular_blocks"] == blocks.blocks
    assert report.config_resolved["workflow"] == blocks.workflows[task]
    assert [x.name for x in report.timings if x.name != "load"] == ["encode", "denoise", "decode", "export"]
    stages = [
        (e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE and e.stage != "load"
    ]
    assert stages == [(s, f) for s in ("encode", "denoise", "decode", "export") for f in (False, True)]
    steps = [e.progress.step for e in events if e.kind is t.EventKind.PROGRESS and e.progress]
    assert steps == [1, 2]


@pytest.mark.parametrize(("family", "count"), [(FLUX2, 5), (QWEN, 5)])
def test_the_family_s_tasks_hold_each_module_once(
    modular: ModularExecutor, made: Run, family: Family, count: int
) -> None:
    for task in family.tasks:
        made("modular", family, task, seed=11)
    manager = modular.modular.manager
    [ids] = [ids for name, ids in manager.collections.items() if family.model in name]
    held = {component_id.rsplit("_", 1)[0]: manager.components[component_id] for component_id in ids}
    # Text encoder, tokenizer, transformer, VAE, scheduler: the very modules the model cache loaded
    # (the guider, image processor and Qwen's pachifier are made from configs, not loaded).
    assert len(ids) == count
    for task in family.tasks:
        loaded = modular.components(_assignment(family, task).model, task)
        assert sorted(held) == sorted(name for name, c in loaded.items() if c is not None)
        assert all(held[name] is loaded[name] for name in held)
    for module in held.values():  # once in the whole manager, whatever else it holds
        assert sum(c is module for c in manager.components.values()) == 1


def _refused(modular: ModularExecutor, family: Family, task: t.Task, **fields: object) -> ItemOutcome:
    return run_family(modular, family, task, inputs=INPUTS[task], **fields)


def test_what_the_blocks_cannot_do_is_refused_naming_the_field(modular: ModularExecutor) -> None:
    # FLUX.2's guidance is an embedding (no negative prompt) and its image a reference (no strength).
    flux2 = _refused(modular, FLUX2, t.Task.TEXT2IMAGE, negative_prompt="blurry")
    assert refusal(flux2) == ("INVALID_ARGUMENT", "negative_prompt")
    assert refusal(_refused(modular, FLUX2, t.Task.IMAGE2IMAGE, strength=0.5)) == (
        "INVALID_ARGUMENT",
        "strength",
    )
    # The request's guidance_scale is Qwen-Image's true CFG scale: an extra setting it is refused.
    outcome = run_family(modular, QWEN, negative_prompt="blurry", extra={"true_cfg_scale": 2.0})
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.true_cfg_scale")
