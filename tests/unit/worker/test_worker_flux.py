"""Flux.1 text2image and image2image through the real legacy_call executor (`builtin:tiny-flux`).

Flux embeds the guidance scale into its transformer (FLUX.1-dev) instead of running
classifier-free guidance; image2image is diffusers' `FluxImg2ImgPipeline` derived from the
loaded pipeline (`from_pipe`, the same modules). It packs 2x2 latent patches into one token, so
sizes are multiples of 16 (VAE factor 8 x 2): off it, Flux would quietly make a smaller image
than asked; the worker refuses it, INVALID_ARGUMENT naming the field.
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

MODEL = "tiny-flux"
# 64x64 (8x8 latents through the tiny VAE's real 8x factor, 16 packed tokens), 2 steps.
DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 3.5, "seed": 7}
# 4 steps: at 2, the flow-matching schedule starts image2image at sigma 1 (pure noise) whatever
# the strength.
IMG2IMG = {"strength": 0.5, "num_inference_steps": 4}
TASKS = {"text2image": types_pb2.TASK_TEXT2IMAGE, "image2image": types_pb2.TASK_IMAGE2IMAGE}


def run(
    executor: LegacyCallExecutor,
    task: str = "text2image",
    *,
    image: bytes = b"",
    extra: dict | None = None,
    **fields: object,
) -> list[ItemOutcome]:
    """One job of `task` on tiny Flux (an image input when given), shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-flux",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="FluxPipeline",
            execution_mode="legacy_call",
            tasks=list(TASKS.values()),
        ),
    )
    request = types_pb2.GenerateRequest(
        task=TASKS[task], model=MODEL, prompt="a red fox", **{**DEFAULTS, **fields}
    )
    if image:
        request.inputs.add(role=types_pb2.MEDIA_ROLE_IMAGE, data=image)
    if extra:
        request.extra.update(extra)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2image with seed 7 twice, seed 8 once, at 96x64, at guidance 1 and with a negative
    prompt under true CFG; image2image of two init images."""
    red, noise = png_bytes(Image.new("RGB", (64, 64), "red")), png_bytes(noise_image(3))
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
        "true-cfg": only_result(run(executor, negative_prompt="blurry", extra={"true_cfg_scale": 2.0})),
        "img2img-red": only_result(run(executor, "image2image", image=red, **IMG2IMG)),
        "img2img-red-again": only_result(run(executor, "image2image", image=red, **IMG2IMG)),
        "img2img-noise": only_result(run(executor, "image2image", image=noise, **IMG2IMG)),
    }


def test_text2image_runs_the_flux_pipeline_at_the_requested_size(images: dict[str, t.GenerateResult]) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.TEXT2IMAGE, "FluxPipeline")
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_guidance_and_a_true_cfg_negative_prompt_reach_the_model(images: dict[str, t.GenerateResult]) -> None:
    # guidance_scale is embedded into the transformer (no second branch); a negative prompt
    # counts only under true classifier-free guidance (`true_cfg_scale` > 1).
    first = pixels(images["first"].artifacts[0])
    assert np.abs(first - pixels(images["guidance1"].artifacts[0])).mean() > 0.5
    assert np.abs(first - pixels(images["true-cfg"].artifacts[0])).mean() > 0.5
    assert images["true-cfg"].report.config_resolved["true_cfg_scale"] == 2.0


def test_image2image_is_the_flux_img2img_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    red, again, noise = (images[key] for key in ("img2img-red", "img2img-red-again", "img2img-noise"))
    assert (red.report.task, red.report.pipeline_class) == (t.Task.IMAGE2IMAGE, "FluxImg2ImgPipeline")
    assert red.report.config_resolved["strength"] == 0.5
    assert (red.artifacts[0].width, red.artifacts[0].height) == (64, 64)
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    assert np.abs(pixels(red.artifacts[0]) - pixels(noise.artifacts[0])).mean() > 2
    assert np.abs(pixels(red.artifacts[0]) - pixels(images["first"].artifacts[0])).mean() > 2


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_packing_multiple_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # 40 is a multiple of the VAE factor 8 (and passes the controller) but not of 8 x 2: Flux
    # itself would warn and make a 32-pixel side.
    for task, image in (("text2image", b""), ("image2image", png_bytes(noise_image(4)))):
        [outcome] = run(executor, task, image=image, **{name: 40})
        assert outcome.error is not None and outcome.result is None
        assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", name)
        assert "multiple of 16" in outcome.error.message


def test_a_negative_prompt_without_true_cfg_is_refused_not_ignored(executor: LegacyCallExecutor) -> None:
    """FLUX.1-dev's guidance is an embedding: its pipeline would drop the negative prompt silently."""
    [outcome] = run(executor, negative_prompt="blurry")
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "negative_prompt")
    assert "true_cfg_scale > 1" in outcome.error.message
    [outcome] = run(executor, negative_prompt="blurry", extra={"true_cfg_scale": 1.0})
    assert outcome.error is not None and outcome.error.field == "negative_prompt"
