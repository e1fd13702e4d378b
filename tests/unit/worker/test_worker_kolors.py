"""Kolors text2image and image2image through the real legacy_call executor (`builtin:tiny-kolors`).

Kolors is SDXL's UNet conditioned on a ChatGLM3 text encoder (its second-to-last hidden states,
and its last token's state as the pooled embedding), tokenized by `ChatGLMTokenizer` over a
SentencePiece model; classifier-free guidance is SDXL's. Image-to-image is diffusers'
`KolorsImg2ImgPipeline` derived from the loaded pipeline (`from_pipe`). The UNet takes any latent
size, so sizes are multiples of the VAE factor 8; off it, the pipeline's own ValueError would be
INTERNAL: the worker refuses it first, INVALID_ARGUMENT naming the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    Family,
    check_image,
    check_seeded,
    noise_image,
    only_result,
    pixel_difference,
    pixels,
    png_bytes,
    refusal,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny.registry import ensure_builtin

# 64x64 (8x8 latents through the tiny VAE's real 8x factor), 2 steps.
KOLORS = Family(
    "tiny-kolors",
    "KolorsPipeline",
    (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE),
    {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 5.0, "seed": 7},
)
IMG2IMG = {"strength": 0.6, "num_inference_steps": 4}
RED = png_bytes(Image.new("RGB", (64, 64), "red"))


def run(
    executor: LegacyCallExecutor, task: t.Task | None = None, image: bytes = b"", **fields: object
) -> ItemOutcome:
    return run_family(executor, KOLORS, task, inputs=((IMAGE, image),) if image else (), **fields)


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2image with seed 7 twice, seed 8, at 96x64, at guidance 1 and with another prompt;
    image2image of a red image twice and of a noise image once."""
    noise = png_bytes(noise_image(3))
    i2i = t.Task.IMAGE2IMAGE
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
        "other-prompt": only_result(run_family(executor, KOLORS, prompt="a blue boat")),
        "red": only_result(run(executor, i2i, RED, **IMG2IMG)),
        "red-again": only_result(run(executor, i2i, RED, **IMG2IMG)),
        "noise": only_result(run(executor, i2i, noise, **IMG2IMG)),
    }


def test_text2image_runs_the_kolors_pipeline_at_the_requested_size(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.TEXT2IMAGE, "KolorsPipeline")
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_the_prompt_and_the_guidance_reach_the_unet(images: dict[str, t.GenerateResult]) -> None:
    # Random tiny weights: text moves pixels by ~3-5 next to a seed's ~30; without it, by 0.
    assert pixel_difference(images["first"], images["other-prompt"]) > 1
    assert pixel_difference(images["first"], images["guidance1"]) > 1
    assert images["first"].report.config_resolved["guidance_scale"] == 5.0


def test_image2image_is_the_kolors_img2img_pipeline_conditioned_on_the_image(
    images: dict[str, t.GenerateResult],
) -> None:
    red, again, noise = (images[key] for key in ("red", "red-again", "noise"))
    assert (red.report.task, red.report.pipeline_class) == (t.Task.IMAGE2IMAGE, "KolorsImg2ImgPipeline")
    assert red.report.config_resolved["strength"] == pytest.approx(0.6)
    assert (red.artifacts[0].width, red.artifacts[0].height) == (64, 64)
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    assert pixel_difference(red, noise) > 1, "another init image must change the output"
    assert pixel_difference(red, images["first"]) > 2, "image2image must differ from text2image"


def test_every_build_makes_the_same_files(tmp_path: Path, model_dir: Path) -> None:
    # Same seed, same bytes holds on every machine only if each build writes the same weights
    # and the tokenizer's SentencePiece model.
    built = ensure_builtin(KOLORS.model, model_dir)
    rebuilt = ensure_builtin(KOLORS.model, tmp_path)
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file())
    for name in files:
        assert (rebuilt / name).read_bytes() == (built / name).read_bytes(), name


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_vae_multiple_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # The controller refuses it too; a worker sent one directly must not fail INTERNAL.
    for task, image in ((t.Task.TEXT2IMAGE, b""), (t.Task.IMAGE2IMAGE, png_bytes(noise_image(4)))):
        outcome = run(executor, task, image, **{name: 60})
        assert refusal(outcome) == ("INVALID_ARGUMENT", name)
        assert outcome.error is not None and "multiple of 8" in outcome.error.message
