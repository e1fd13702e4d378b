"""Stable Diffusion 3 text2image and image2image through the real legacy_call executor (`builtin:tiny-sd3`).

SD3 is a flow-matching transformer over two CLIP encoders and T5; image2image is diffusers'
`StableDiffusion3Img2ImgPipeline` derived from the loaded pipeline (`from_pipe`, the same
modules). Its sizes are multiples of the VAE factor times the transformer's patch (8 x 2): a
size off it is INVALID_ARGUMENT naming the field, not the pipeline's ValueError as INTERNAL.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_worker_tasks import noise_image, only_result, pixels, png_bytes
from worker_testing import check_image, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

MODEL = "tiny-sd3"
# 64x64 (8x8 latents through the tiny VAE's real 8x factor, 4x4 patches of 2), 2 steps.
DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 5.0, "seed": 7}
IMG2IMG = {"strength": 0.6, "num_inference_steps": 4}
TASKS = {"text2image": types_pb2.TASK_TEXT2IMAGE, "image2image": types_pb2.TASK_IMAGE2IMAGE}


def run(
    executor: LegacyCallExecutor, task: str = "text2image", *, image: bytes = b"", **fields: object
) -> list[ItemOutcome]:
    """One job of `task` on tiny SD3 (an image input when given), shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-sd3",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="StableDiffusion3Pipeline",
            execution_mode="legacy_call",
            tasks=list(TASKS.values()),
        ),
    )
    request = types_pb2.GenerateRequest(
        task=TASKS[task], model=MODEL, prompt="a red fox", **{**DEFAULTS, **fields}
    )
    if image:
        request.inputs.add(role=types_pb2.MEDIA_ROLE_IMAGE, data=image)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2image with seed 7 twice, seed 8 once, at 96x64 and with a negative prompt;
    image2image of two init images (4 steps: at 2, SD3's shifted schedule starts image2image
    at sigma 1, pure noise, whatever the strength)."""
    red, noise = png_bytes(Image.new("RGB", (64, 64), "red")), png_bytes(noise_image(3))
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "negative": only_result(run(executor, negative_prompt="blurry")),
        "img2img-red": only_result(run(executor, "image2image", image=red, **IMG2IMG)),
        "img2img-red-again": only_result(run(executor, "image2image", image=red, **IMG2IMG)),
        "img2img-noise": only_result(run(executor, "image2image", image=noise, **IMG2IMG)),
    }


def test_text2image_runs_the_sd3_pipeline_at_the_requested_size(images: dict[str, t.GenerateResult]) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (
        t.Task.TEXT2IMAGE,
        "StableDiffusion3Pipeline",
    )
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_or_negative_prompt_other_image(
    images: dict[str, t.GenerateResult],
) -> None:
    first, again, other, negative = (
        images[key].artifacts[0] for key in ("first", "again", "other-seed", "negative")
    )
    assert first.sha256 == again.sha256
    assert np.abs(pixels(first) - pixels(other)).mean() > 1
    # The negative prompt reaches the unconditional branch of classifier-free guidance.
    assert np.abs(pixels(first) - pixels(negative)).mean() > 0.5


def test_image2image_is_the_sd3_img2img_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    red, again, noise = (images[key] for key in ("img2img-red", "img2img-red-again", "img2img-noise"))
    assert (red.report.task, red.report.pipeline_class) == (
        t.Task.IMAGE2IMAGE,
        "StableDiffusion3Img2ImgPipeline",
    )
    assert red.report.config_resolved["strength"] == pytest.approx(0.6)
    assert (red.artifacts[0].width, red.artifacts[0].height) == (64, 64)
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    assert np.abs(pixels(red.artifacts[0]) - pixels(noise.artifacts[0])).mean() > 2
    assert np.abs(pixels(red.artifacts[0]) - pixels(images["first"].artifacts[0])).mean() > 2


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_multiple_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # 40 is a multiple of the VAE factor 8 (and passes the controller) but not of 8 x patch 2.
    [outcome] = run(executor, **{name: 40})
    assert outcome.error is not None and outcome.result is None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", name)
    assert "multiple of 16" in outcome.error.message
