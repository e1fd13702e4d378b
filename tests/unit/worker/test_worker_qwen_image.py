"""Qwen-Image text2image, image2image and inpaint through the legacy_call executor (`tiny-qwen-image`).

Qwen-Image is not guidance-distilled: its `guidance_scale` argument is ignored (kept for distilled
variants), and classifier-free guidance is `true_cfg_scale` with a negative prompt. The worker
gives it the request's guidance_scale as `true_cfg_scale`, against the empty prompt when the
request has no negative prompt, so guidance changes the image as on any other family.
Image-to-image and inpaint are diffusers' `QwenImageImg2ImgPipeline` and
`QwenImageInpaintPipeline` derived from the loaded pipeline (`from_pipe`). Sizes are multiples of
16 (VAE factor 8 x the 2x2 latent packing); off it, INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    MASK,
    TASKS,
    Family,
    check_image,
    check_seeded,
    noise_image,
    only_result,
    pixel_difference,
    pixels,
    png_bytes,
    refusal,
    run_assignment,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny.registry import ensure_builtin

# 64x64 (8x8 latents through the tiny VAE's real 8x factor, 16 packed tokens), 2 steps.
QWEN = Family(
    "tiny-qwen-image",
    "QwenImagePipeline",
    (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT),
    {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 4.0, "seed": 7},
)
# 4 steps: at 2, the flow-matching schedule starts image2image at sigma 1 (pure noise) whatever
# the strength.
IMG2IMG = {"strength": 0.5, "num_inference_steps": 4}
RED = png_bytes(Image.new("RGB", (64, 64), "red"))


def run(
    executor: LegacyCallExecutor, task: t.Task | None = None, image: bytes = b"", **fields: object
) -> ItemOutcome:
    return run_family(executor, QWEN, task, inputs=((IMAGE, image),) if image else (), **fields)


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2image with seed 7 twice, seed 8, at 96x64, at guidance 1 and 2, with a negative prompt
    and another prompt; image2image of a red image twice and of a noise image once."""
    noise = png_bytes(noise_image(3))
    i2i = t.Task.IMAGE2IMAGE
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
        "guidance2": only_result(run(executor, guidance_scale=2.0)),
        "negative": only_result(run(executor, negative_prompt="blurry")),
        "other-prompt": only_result(run_family(executor, QWEN, prompt="a blue boat")),
        "red": only_result(run(executor, i2i, RED, **IMG2IMG)),
        "red-again": only_result(run(executor, i2i, RED, **IMG2IMG)),
        "noise": only_result(run(executor, i2i, noise, **IMG2IMG)),
    }


def test_text2image_runs_the_qwen_image_pipeline_at_the_requested_size(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.TEXT2IMAGE, "QwenImagePipeline")
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_the_request_guidance_is_true_cfg_against_the_empty_prompt(
    images: dict[str, t.GenerateResult],
) -> None:
    # Passed on as `guidance_scale`, the pipeline would ignore it (not a distilled model) and
    # guidance 1, 2 and 4 would make one image.
    first = images["first"]
    # Random tiny weights: the text moves pixels by ~0.3-0.7 (a seed by ~17); broken, by 0.
    assert pixel_difference(first, images["guidance1"]) > 0.1, "guidance 4 runs CFG, 1 does not"
    assert pixel_difference(first, images["guidance2"]) > 0.1, "the scale itself reaches true_cfg_scale"
    assert pixel_difference(first, images["negative"]) > 0.1, "a negative prompt replaces the empty one"
    assert first.report.config_resolved["guidance_scale"] == 4.0


def test_the_prompt_reaches_the_model_behind_the_template(
    images: dict[str, t.GenerateResult], model_dir: Path
) -> None:
    from diffusers import QwenImagePipeline

    assert pixel_difference(images["first"], images["other-prompt"]) > 0.1
    # The pipeline drops its template's prefix by a fixed token count (Qwen2's): the offline
    # tokenizer must encode that prefix in exactly as many, or the prompt loses its first words.
    pipeline = QwenImagePipeline.from_pretrained(ensure_builtin(QWEN.model, model_dir))
    prefix = pipeline.prompt_template_encode.split("{}")[0]
    assert len(pipeline.tokenizer(prefix)["input_ids"]) == pipeline.prompt_template_encode_start_idx


def test_a_batch_without_negative_prompts_runs_each_job_as_alone(
    executor: LegacyCallExecutor, images: dict[str, t.GenerateResult]
) -> None:
    # One call for two jobs: the empty negative prompt goes one per prompt, and each job makes
    # the image it makes alone (up to the rounding of a padded prompt).
    msg = gateway_pb2.Assignment(
        assignment_id="as-qwen-batch",
        batch_group_id="bg-1",
        model=models_pb2.ModelSpec(
            id=QWEN.model,
            source=f"builtin:{QWEN.model}",
            pipeline_class=QWEN.pipeline_class,
            execution_mode="legacy_call",
            tasks=[TASKS[task] for task in QWEN.tasks],
        ),
    )
    for index, prompt in enumerate(("a red fox", "a blue boat")):
        request = types_pb2.GenerateRequest(
            task=types_pb2.TASK_TEXT2IMAGE, model=QWEN.model, prompt=prompt, **QWEN.defaults
        )
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    fox, boat = (only_result(outcome) for outcome in outcomes)
    assert fox.report.batch_size == 2
    assert pixel_difference(fox, images["first"]) < 0.01
    assert pixel_difference(boat, images["other-prompt"]) < 0.01
    assert pixel_difference(fox, images["guidance1"]) > 0.1, "a batch runs CFG too"


def test_an_extra_true_cfg_scale_is_refused_as_the_request_sets_it(executor: LegacyCallExecutor) -> None:
    outcome = run_family(executor, QWEN, negative_prompt="blurry", extra={"true_cfg_scale": 2.0})
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.true_cfg_scale")
    assert outcome.error is not None and "guidance_scale" in outcome.error.message


def test_image2image_is_the_qwen_image_img2img_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    red, again, noise = (images[key] for key in ("red", "red-again", "noise"))
    assert (red.report.task, red.report.pipeline_class) == (t.Task.IMAGE2IMAGE, "QwenImageImg2ImgPipeline")
    assert red.report.config_resolved["strength"] == 0.5
    assert (red.artifacts[0].width, red.artifacts[0].height) == (64, 64)
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    assert pixel_difference(red, noise) > 0.5, "another init image must change the output"
    assert pixel_difference(red, images["first"]) > 2, "image2image must differ from text2image"


def test_every_build_makes_the_same_files(tmp_path: Path, model_dir: Path) -> None:
    # Same seed, same bytes holds on every machine only if each build writes the same weights
    # and the tokenizer.
    built = ensure_builtin(QWEN.model, model_dir)
    rebuilt = ensure_builtin(QWEN.model, tmp_path)
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file())
    for name in files:
        assert (rebuilt / name).read_bytes() == (built / name).read_bytes(), name


def test_inpaint_is_the_qwen_image_inpaint_pipeline_and_keeps_the_unmasked_half(
    executor: LegacyCallExecutor,
) -> None:
    init = noise_image(4)
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half
    inputs = ((IMAGE, png_bytes(init)), (MASK, png_bytes(mask)))
    result = only_result(
        run_family(executor, QWEN, t.Task.INPAINT, inputs=inputs, **{**IMG2IMG, "strength": 1.0})
    )
    assert result.report.pipeline_class == "QwenImageInpaintPipeline"
    out, source = pixels(result.artifacts[0]), np.asarray(init, dtype=np.float32)
    assert np.abs(out[:, :32] - source[:, :32]).mean() < 1.0, "the unmasked half is the input's"
    assert np.abs(out[:, 32:] - source[:, 32:]).mean() > 20.0, "the masked half is repainted"


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_packing_multiple_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # 40 is a multiple of the VAE factor 8 (and passes the controller) but not of 8 x 2: the
    # pipeline itself would warn and make a 32-pixel side.
    for task, image in ((t.Task.TEXT2IMAGE, b""), (t.Task.IMAGE2IMAGE, png_bytes(noise_image(4)))):
        outcome = run(executor, task, image, **{name: 40})
        assert refusal(outcome) == ("INVALID_ARGUMENT", name)
        assert outcome.error is not None and "multiple of 16" in outcome.error.message
