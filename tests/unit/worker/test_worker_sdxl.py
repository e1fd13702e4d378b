"""Stable Diffusion XL text2image and image2image through the real legacy_call executor (`builtin:tiny-sdxl`).

SDXL conditions its UNet on two CLIP encoders' hidden states, the second one's pooled embedding
and its size/crop micro-conditions; image2image is diffusers' `StableDiffusionXLImg2ImgPipeline`
derived from the loaded pipeline (`from_pipe`, the same modules).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_worker_tasks import noise_image, only_result, pixels, png_bytes
from worker_testing import check_image, check_seeded, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

MODEL = "tiny-sdxl"
# 64x64 (8x8 latents through the tiny VAE's real 8x factor), 2 steps.
DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 5.0, "seed": 7}
TASKS = {"text2image": types_pb2.TASK_TEXT2IMAGE, "image2image": types_pb2.TASK_IMAGE2IMAGE}


def run(
    executor: LegacyCallExecutor, task: str = "text2image", *, image: bytes = b"", **fields: object
) -> list[ItemOutcome]:
    """One job of `task` on tiny SDXL (an image input when given), shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-sdxl",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="StableDiffusionXLPipeline",
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
    """text2image with seed 7 twice, seed 8 once and at 96x64; image2image of two init images."""
    red, noise = png_bytes(Image.new("RGB", (64, 64), "red")), png_bytes(noise_image(3))
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "img2img-red": only_result(run(executor, "image2image", image=red, strength=0.6)),
        "img2img-red-again": only_result(run(executor, "image2image", image=red, strength=0.6)),
        "img2img-noise": only_result(run(executor, "image2image", image=noise, strength=0.6)),
    }


def test_text2image_runs_the_sdxl_pipeline_at_the_requested_size(images: dict[str, t.GenerateResult]) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert result.report.task is t.Task.TEXT2IMAGE
    assert result.report.pipeline_class == "StableDiffusionXLPipeline"
    assert result.report.seeds == [7]
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_image2image_is_the_sdxl_img2img_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["img2img-red"]
    [image] = result.artifacts
    assert (image.width, image.height) == (64, 64)
    assert result.report.task is t.Task.IMAGE2IMAGE
    assert result.report.pipeline_class == "StableDiffusionXLImg2ImgPipeline"
    assert result.report.config_resolved["strength"] == pytest.approx(0.6)
    assert image.sha256 == images["img2img-red-again"].artifacts[0].sha256
    red, noise, text = (pixels(images[key].artifacts[0]) for key in ("img2img-red", "img2img-noise", "first"))
    assert np.abs(red - noise).mean() > 2, "another init image must change the output"
    assert np.abs(red - text).mean() > 2, "image2image must differ from text2image"
