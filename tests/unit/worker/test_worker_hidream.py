"""HiDream-I1 text2image through the real legacy_call executor, on `builtin:tiny-hidream`.

HiDream encodes the prompt four ways (two CLIPs pooled, T5, and the hidden states of every Llama
layer, one per block) and runs classifier-free guidance when guidance_scale > 1, where the
negative prompt counts. Sizes are multiples of 16 (VAE factor 8 x patch 2), and the pipeline
makes every image 1024x1024 pixels in area, rescaling any other request to it, keeping the aspect
ratio: the worker refuses a size it would change, INVALID_ARGUMENT naming the field, instead of
answering 512x512 with a 1024x1024 image.
"""

from __future__ import annotations

import numpy as np
import pytest
from worker_testing import Family, check_image, check_seeded, only_result, pixels, refusal, run_family

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

# The pipeline's own area (the tiny VAE keeps the real 8x factor: 128x128 latents, 4096 tokens).
HIDREAM = Family(
    "tiny-hidream",
    "HiDreamImagePipeline",
    (t.Task.TEXT2IMAGE,),
    {"width": 1024, "height": 1024, "num_inference_steps": 2, "guidance_scale": 5.0, "seed": 7},
)


def run(executor: LegacyCallExecutor, **fields: object) -> ItemOutcome:
    return run_family(executor, HIDREAM, **fields)


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice, seed 8 once, without guidance, with a negative prompt, and 1360x768 (about
    the same area, another aspect ratio)."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
        "negative": only_result(run(executor, negative_prompt="blurry")),
        "wide": only_result(run(executor, width=1360, height=768)),
    }


def test_text2image_runs_the_hidream_pipeline_at_the_requested_size(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 1024, 1024)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.TEXT2IMAGE, "HiDreamImagePipeline")
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (1360, 768) and pixels(wide).shape == (768, 1360, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_guidance_and_the_negative_prompt_reach_the_model(images: dict[str, t.GenerateResult]) -> None:
    # guidance_scale 1 turns classifier-free guidance off (one branch); above 1, the negative
    # prompt is the other branch.
    first = pixels(images["first"].artifacts[0])
    assert np.abs(first - pixels(images["guidance1"].artifacts[0])).mean() > 0.5
    assert np.abs(first - pixels(images["negative"].artifacts[0])).mean() > 0.5


@pytest.mark.parametrize("name", ["width", "height"])
def test_a_size_off_the_16_grid_is_invalid_argument_naming_it(
    executor: LegacyCallExecutor, name: str
) -> None:
    # 1000 is a multiple of the VAE factor 8 but not of 8 x patch 2.
    outcome = run(executor, **{name: 1000})
    assert refusal(outcome) == ("INVALID_ARGUMENT", name)
    assert outcome.error is not None and "multiple of 16" in outcome.error.message


@pytest.mark.parametrize(
    ("size", "field", "made"),
    [
        ((512, 512), "width", "1024x1024"),
        ((1024, 1088), "width", "992x1040"),
        ((512, 1968), "height", "512x2000"),
    ],
)
def test_a_size_the_pipeline_would_rescale_is_invalid_argument(
    executor: LegacyCallExecutor, size: tuple[int, int], field: str, made: str
) -> None:
    # On the grid, off the area: HiDream would make another size than asked.
    width, height = size
    outcome = run(executor, width=width, height=height)
    assert refusal(outcome) == ("INVALID_ARGUMENT", field)
    assert outcome.error is not None and f"would come out {made}" in outcome.error.message
