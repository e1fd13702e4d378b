"""FLUX.2 text2image and image2image through the real legacy_call executor (`builtin:tiny-flux2`).

FLUX.2-dev embeds the guidance scale into its transformer (no second branch, so no negative
prompt: one is INVALID_ARGUMENT naming it). Its one pipeline, `Flux2Pipeline`, takes input images
as references the transformer attends to (FLUX.2's editing): image2image is that same pipeline
(diffusers' `AutoPipelineForImage2Image` maps FLUX.2 to it, built with `from_pipe` on the loaded
modules), starting from noise, with no strength. It packs 2x2 latent patches into one token, so
sizes are multiples of 16 (VAE factor 8 x 2); off it, INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    Family,
    check_image,
    check_seeded,
    noise_image,
    only_result,
    pixels,
    png_bytes,
    refusal,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

# 64x64 (8x8 latents through the tiny VAE's real 8x factor, 16 packed tokens), 2 steps.
FLUX2 = Family(
    "tiny-flux2",
    "Flux2Pipeline",
    (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE),
    {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 4.0, "seed": 7},
)
RED = png_bytes(Image.new("RGB", (64, 64), "red"))


def run(
    executor: LegacyCallExecutor, task: t.Task | None = None, image: bytes = b"", **fields: object
) -> ItemOutcome:
    return run_family(executor, FLUX2, task, inputs=((IMAGE, image),) if image else (), **fields)


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2image with seed 7 twice, seed 8 once, at 96x64 and at guidance 1; image2image of a
    red image twice and of a noise image once."""
    noise = png_bytes(noise_image(3))
    i2i = t.Task.IMAGE2IMAGE
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
        "red": only_result(run(executor, i2i, RED)),
        "red-again": only_result(run(executor, i2i, RED)),
        "noise": only_result(run(executor, i2i, noise)),
    }


def test_text2image_runs_the_flux2_pipeline_at_the_requested_size(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.TEXT2IMAGE, "Flux2Pipeline")
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_guidance_reaches_the_model(images: dict[str, t.GenerateResult]) -> None:
    # Embedded into the transformer's timestep conditioning (FLUX.2-dev is guidance-distilled).
    first = pixels(images["first"].artifacts[0])
    assert np.abs(first - pixels(images["guidance1"].artifacts[0])).mean() > 0.5
    assert images["guidance1"].report.config_resolved["guidance_scale"] == 1.0


def test_image2image_is_the_flux2_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    red, again, noise = (images[key] for key in ("red", "red-again", "noise"))
    assert (red.report.task, red.report.pipeline_class) == (t.Task.IMAGE2IMAGE, "Flux2Pipeline")
    assert (red.artifacts[0].width, red.artifacts[0].height) == (64, 64)
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    # The reference tokens are 16 of the ~530 the image attends to in the tiny model: a small
    # change, but the same seed makes the same noise, so any change is the image's.
    text_only = pixels(images["first"].artifacts[0])
    assert np.abs(pixels(red.artifacts[0]) - pixels(noise.artifacts[0])).mean() > 0.01
    assert np.abs(pixels(red.artifacts[0]) - text_only).mean() > 0.01
    assert len({red.artifacts[0].sha256, noise.artifacts[0].sha256, images["first"].artifacts[0].sha256}) == 3


def test_fields_flux2_has_no_argument_for_are_invalid_argument(executor: LegacyCallExecutor) -> None:
    # No negative prompt (guidance is embedded), no strength (the image is a reference, not a start).
    assert refusal(run(executor, negative_prompt="blurry")) == ("INVALID_ARGUMENT", "negative_prompt")
    assert refusal(run(executor, t.Task.IMAGE2IMAGE, RED, strength=0.5)) == ("INVALID_ARGUMENT", "strength")


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_packing_multiple_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # 40 is a multiple of the VAE factor 8 but not of 8 x 2: FLUX.2 would warn and make 32.
    for task, image in ((t.Task.TEXT2IMAGE, b""), (t.Task.IMAGE2IMAGE, png_bytes(noise_image(4)))):
        outcome = run(executor, task, image, **{name: 40})
        assert refusal(outcome) == ("INVALID_ARGUMENT", name)
        assert outcome.error is not None and "multiple of 16" in outcome.error.message
