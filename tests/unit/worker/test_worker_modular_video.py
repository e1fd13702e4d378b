"""The `modular` mode on diffusers' video blocks: Wan 2.1 image-to-video, Wan 2.2 A14B (two
experts, picked by the checkpoint's `boundary_ratio`) and HunyuanVideo 1.5 text- and
image-to-video (the latter with OmniRT's `keep_hunyuan_video15_image_embeds` block fix).

Each family and task makes the frames `legacy_call` makes of the same request and seed (measured:
identical, 0/255), the same bytes again for the same seed, and what the mode leaves off (Wan 2.2
TI2V-5B, a Wan image-to-video checkpoint without its CLIP image encoder) is refused naming the
model before a frame is made.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from worker_testing import (
    IMAGE,
    TASKS,
    Family,
    noise_image,
    only_result,
    png_bytes,
    produced_frames,
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
from omnirt.worker.modes.modular.executor import ModularExecutor
from omnirt.worker.modes.modular.families import modular_family, supports_modular
from omnirt.worker.tiny.registry import ensure_builtin

# 32x32, 5 frames (2 latent frames), 3 steps: Wan 2.2's timesteps 1000 (high-noise expert) and
# two below its 0.875 boundary (low-noise expert).
VIDEO = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 3, "seed": 7}
WAN = {**VIDEO, "guidance_scale": 5.0}
WAN21_I2V = Family("tiny-wan21-i2v-clip", "WanImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), WAN)
WAN21 = Family("tiny-wan", "WanPipeline", (t.Task.TEXT2VIDEO,), WAN)
WAN22 = Family("tiny-wan22", "WanPipeline", (t.Task.TEXT2VIDEO,), WAN)
WAN22_I2V = Family("tiny-wan22-i2v", "WanImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), WAN)
HUNYUAN15 = Family("tiny-hunyuan-video15", "HunyuanVideo15Pipeline", (t.Task.TEXT2VIDEO,), VIDEO)
HUNYUAN15_I2V = Family(
    "tiny-hunyuan-video15-i2v", "HunyuanVideo15ImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), VIDEO
)
# Left off: TI2V-5B (`expand_timesteps`), Wan I2V without CLIP.
WAN22_TI2V = Family("tiny-wan22-ti2v", "WanPipeline", (t.Task.TEXT2VIDEO,), WAN)
WAN_I2V_NO_CLIP = Family("tiny-wan-i2v", "WanImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), WAN)

PICTURE = ((IMAGE, png_bytes(noise_image(5, (32, 32)))),)
OTHER_PICTURE = ((IMAGE, png_bytes(noise_image(6, (32, 32)))),)


def media(family: Family) -> tuple[tuple[int, bytes], ...]:
    return PICTURE if family.tasks[0] is t.Task.IMAGE2VIDEO else ()


@pytest.fixture(scope="module")
def modular(model_dir: Path, executor: LegacyCallExecutor) -> ModularExecutor:
    """A modular executor on the legacy executor's model cache (the same loaded modules)."""
    config = WorkerConfig(mode="modular", model_dir=str(model_dir), worker_id="w-video", torch_threads=1)
    return ModularExecutor(config, cache=executor.cache)


@pytest.fixture(scope="module")
def wan21_i2v(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Wan 2.1-layout image-to-video model: tiny-wan-i2v's parts with a tiny CLIP image encoder
    and a transformer that takes its embeddings (tiny-wan-i2v has neither, as Wan 2.2's I2V)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    from omnirt.worker.tiny import parts, wan

    base = WanImageToVideoPipeline.from_pretrained(str(ensure_builtin("tiny-wan-i2v", model_dir)))
    kept = {
        k: v
        for k, v in base.components.items()
        if k not in ("transformer", "image_encoder", "image_processor")
    }
    clip = CLIPVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    with parts.seeded():
        image_encoder = CLIPVisionModel(clip)
        # Image embeddings of CLIP's width into the cross-attention (2 heads x 12).
        transformer = WanTransformer3DModel(**wan.transformer_config(12), image_dim=16, added_kv_proj_dim=24)
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    target = tmp_path_factory.mktemp("wan21") / WAN21_I2V.model
    pipeline: Any = WanImageToVideoPipeline(
        **kept, transformer=transformer, image_encoder=image_encoder, image_processor=processor
    )
    pipeline.save_pretrained(str(target))
    return target


def run(
    executor: LegacyCallExecutor,
    family: Family,
    *,
    source: Path | None = None,
    inputs: tuple[tuple[int, bytes], ...] | None = None,
    extra: dict[str, Any] | None = None,
    **fields: object,
) -> ItemOutcome:
    """One job of `family`'s task (builtin, or the model saved at `source`), negative prompt set."""
    if source is None:
        media_in = media(family) if inputs is None else inputs
        return run_family(executor, family, inputs=media_in, extra=extra, negative_prompt="blurry", **fields)
    task = family.tasks[0]
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-{source.name}",
        model=models_pb2.ModelSpec(
            id=source.name,
            source=str(source),
            pipeline_class=family.pipeline_class,
            execution_mode="legacy_call",
            tasks=[TASKS[task]],
        ),
    )
    values = {**family.defaults, **fields}
    request = types_pb2.GenerateRequest(
        task=TASKS[task], model=source.name, prompt="a red fox", negative_prompt="blurry", **values
    )
    for role, data in PICTURE if inputs is None else inputs:
        request.inputs.add(role=role, data=data)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def component(modular: ModularExecutor, family: Family, name: str) -> Any:
    """`family`'s module `name` as the worker's ComponentsManager holds it (its model's collection)."""
    manager = modular.modular.manager
    [ids] = [ids for key, ids in manager.collections.items() if key.startswith(f"builtin:{family.model} (")]
    [module] = [manager.components[i] for i in ids if i.rsplit("_", 1)[0] == name]
    return module


def frames(result: t.GenerateResult) -> np.ndarray:
    return produced_frames(result.artifacts[0]).astype(np.int16)


CASES = [
    (WAN21_I2V, "WanImage2VideoAutoBlocks", "image2video"),
    (WAN22, "Wan22Blocks", "all"),
    (WAN22_I2V, "Wan22Image2VideoBlocks", "all"),
    (HUNYUAN15, "HunyuanVideo15AutoBlocks", "text2video"),
    # The SigLIP image embeddings reach the denoiser (diffusers' blocks alone: zeros, 35/255 off).
    (HUNYUAN15_I2V, "HunyuanVideo15AutoBlocks", "image2video"),
]


@pytest.mark.parametrize(("family", "blocks", "workflow"), CASES, ids=lambda x: getattr(x, "model", None))
def test_the_blocks_make_the_frames_legacy_call_makes(
    modular: ModularExecutor,
    executor: LegacyCallExecutor,
    wan21_i2v: Path,
    family: Family,
    blocks: str,
    workflow: str,
) -> None:
    source = wan21_i2v if family is WAN21_I2V else None
    ours = only_result(run(modular, family, source=source))
    theirs = only_result(run(executor, family, source=source))
    assert ours.report is not None and ours.report.pipeline_class.endswith("ModularPipeline")
    assert ours.report.task is family.tasks[0]
    assert ours.report.config_resolved["modular_blocks"] == blocks
    assert ours.report.config_resolved["workflow"] == workflow
    made, expected = frames(ours), frames(theirs)
    assert made.shape == expected.shape == (5, 32, 32, 3)
    assert ours.artifacts[0].num_frames == 5
    assert np.std(made.astype(np.float32)) > 1, "not a flat video"
    assert np.abs(made - expected).max() <= 1


@pytest.mark.parametrize(("family", "blocks", "workflow"), CASES, ids=lambda x: getattr(x, "model", None))
def test_same_seed_same_bytes_other_seed_other_bytes(
    modular: ModularExecutor, wan21_i2v: Path, family: Family, blocks: str, workflow: str
) -> None:
    source = wan21_i2v if family is WAN21_I2V else None
    first, again, other = (
        only_result(run(modular, family, source=source, seed=seed)).artifacts[0] for seed in (3, 3, 4)
    )
    assert first.data == again.data
    assert first.data != other.data


@pytest.mark.parametrize("family", [WAN21_I2V, WAN22_I2V, HUNYUAN15_I2V], ids=lambda f: f.model)
def test_image2video_depends_on_its_image(modular: ModularExecutor, wan21_i2v: Path, family: Family) -> None:
    source = wan21_i2v if family is WAN21_I2V else None
    one, two = (only_result(run(modular, family, source=source, inputs=x)) for x in (PICTURE, OTHER_PICTURE))
    # Raw frames: the tiny Wan 2.2 expert moves them by 0.6/255 on average (an ignored image: 0).
    assert np.abs(frames(one) - frames(two)).mean() > 0.1


@pytest.mark.parametrize("family", [WAN22, WAN22_I2V], ids=lambda f: f.model)
def test_both_wan22_experts_denoise(modular: ModularExecutor, family: Family) -> None:
    only_result(run(modular, family))  # loaded, its pipeline made
    high, low = (component(modular, family, name) for name in ("transformer", "transformer_2"))
    calls: list[str] = []
    hooks = [
        high.register_forward_hook(lambda *_: calls.append("high")),
        low.register_forward_hook(lambda *_: calls.append("low")),
    ]
    try:
        only_result(run(modular, family, seed=21))
    finally:
        for hook in hooks:
            hook.remove()
    # Timestep 1000 is above the 0.875 boundary, the other two below it; two passes (guided) each.
    assert calls == ["high"] * 2 + ["low"] * 4


def batch(family: Family, prompts: tuple[str, ...]) -> Assignment:
    """One job per prompt of `family`'s task (seeds 7, 8, ...), as one batch group."""
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-batch-{family.model}",
        model=models_pb2.ModelSpec(
            id=family.model,
            source=f"builtin:{family.model}",
            pipeline_class=family.pipeline_class,
            execution_mode="modular",
            tasks=[TASKS[family.tasks[0]]],
        ),
        batch_group_id="bg-video",
    )
    for index, prompt in enumerate(prompts):
        fields = {**family.defaults, "seed": 7 + index}
        request = types_pb2.GenerateRequest(
            task=TASKS[family.tasks[0]], model=family.model, prompt=prompt, **fields
        )
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    return assignment_from_proto(msg)


def test_a_wan22_batch_is_one_pass_and_each_video_is_its_own_runs(modular: ModularExecutor) -> None:
    together = batch(WAN22, ("a red fox", "a blue boat on the sea"))
    outcomes, _ = run_assignment(modular, together)
    reports = [only_result(o).report for o in outcomes]
    assert reports[0] is not None and reports[1] is not None
    assert reports[0].timing("denoise") == reports[1].timing("denoise")  # one denoising loop
    for item, outcome in zip(together.items, outcomes, strict=True):
        [alone], _ = run_assignment(modular, dataclasses.replace(together, items=[item], batch_group_id=""))
        assert np.abs(frames(only_result(outcome)) - frames(only_result(alone))).max() <= 1


def test_low_noise_guidance_is_the_second_experts_as_in_legacy_call(
    modular: ModularExecutor, executor: LegacyCallExecutor
) -> None:
    low = {"guidance_scale_2": 1.0}
    ours = only_result(run(modular, WAN22, extra=low))
    theirs = only_result(run(executor, WAN22, extra=low))
    default = only_result(run(modular, WAN22))
    assert np.abs(frames(ours) - frames(theirs)).max() <= 1
    assert ours.artifacts[0].data != default.artifacts[0].data
    # A one-transformer Wan takes none: refused naming it, as legacy_call refuses it.
    code, field = refusal(run(modular, WAN21, extra=low))
    assert (code, field) == ("INVALID_ARGUMENT", "extra.guidance_scale_2")


def test_hunyuan_video15_guidance_is_its_guiders_and_a_request_scale_is_refused(
    modular: ModularExecutor,
) -> None:
    code, field = refusal(run(modular, HUNYUAN15, guidance_scale=3.0))
    assert (code, field) == ("INVALID_ARGUMENT", "guidance_scale")


@pytest.mark.parametrize(
    ("family", "words"),
    [
        (WAN22_TI2V, "expand_timesteps"),
        (WAN_I2V_NO_CLIP, "image_encoder"),
    ],
    ids=lambda x: getattr(x, "model", None),
)
def test_what_the_blocks_cannot_run_is_refused_naming_the_model(
    modular: ModularExecutor, family: Family, words: str
) -> None:
    outcome = run(modular, family)
    assert refusal(outcome) == ("FAILED_PRECONDITION", "model")
    assert outcome.error is not None and words in outcome.error.message


def test_the_checkpoint_config_picks_the_wan_blocks() -> None:
    def blocks(pipeline_class: str, config: dict[str, object] | None = None) -> str:
        family = modular_family(pipeline_class, config)
        assert family is not None
        return family.blocks

    assert blocks("WanPipeline") == blocks("WanPipeline", {"boundary_ratio": None}) == "WanBlocks"
    assert blocks("WanPipeline", {"boundary_ratio": 0.875}) == "Wan22Blocks"
    assert blocks("WanImageToVideoPipeline") == "WanImage2VideoAutoBlocks"
    assert blocks("WanImageToVideoPipeline", {"boundary_ratio": 0.9}) == "Wan22Image2VideoBlocks"
    ti2v = modular_family("WanPipeline", {"expand_timesteps": True})
    assert ti2v is not None and ti2v.refused({"expand_timesteps": True}) == ["expand_timesteps"]
    assert supports_modular("HunyuanVideo15Pipeline", t.Task.TEXT2VIDEO)
    # Image-to-video is its own checkpoint (a SigLIP image encoder): not the text-to-video one's.
    assert not supports_modular("HunyuanVideo15Pipeline", t.Task.IMAGE2VIDEO)
    assert supports_modular("HunyuanVideo15ImageToVideoPipeline", t.Task.IMAGE2VIDEO)
