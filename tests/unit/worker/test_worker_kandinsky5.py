"""Kandinsky 5 text2video through the real legacy_call executor, on `builtin:tiny-kandinsky5`.

Sizes must be multiples of 16 (VAE factor 8 x patch 2), else INVALID_ARGUMENT naming the field.
Frame counts are not refused: the pipeline makes a count n off the 4k+1 grid (n // 4) * 4 + 1
frames itself, and the artifact says how many it made. The pipeline wraps the prompt in its
template and drops a fixed 128 tokens: the offline Qwen2 tokenizer keeps the prompt past them.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from worker_testing import (
    IMAGE,
    Family,
    check_image,
    check_video,
    decoded_frames,
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

# 32x32 (2x2 latents, 1x1 patches), 5 frames = 2 latent frames, 2 steps.
KANDINSKY5 = Family(
    "tiny-kandinsky5",
    "Kandinsky5T2VPipeline",
    (t.Task.TEXT2VIDEO,),
    {
        "width": 32,
        "height": 32,
        "num_frames": 5,
        "fps": 8.0,
        "num_inference_steps": 2,
        "guidance_scale": 5.0,
        "seed": 7,
    },
)


def run(executor: LegacyCallExecutor, **fields: object) -> ItemOutcome:
    return run_family(executor, KANDINSKY5, **fields)


def pixel_difference(a: t.GenerateResult, b: t.GenerateResult) -> float:
    frames_a, frames_b = (decoded_frames(r.artifacts[0].data).astype(np.float32) for r in (a, b))
    return float(np.abs(frames_a - frames_b).mean())


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice, seed 8, another prompt, a negative prompt, and a 64x32 video of 9 frames."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "other-prompt": only_result(run(executor, prompt="a blue boat on the sea")),
        "negative": only_result(run(executor, negative_prompt="a blue boat")),
        "64x32x9": only_result(run(executor, width=64, height=32, num_frames=9)),
    }


def test_text2video_runs_the_kandinsky5_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "Kandinsky5T2VPipeline"


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    [video] = videos["first"].artifacts
    assert (video.kind, video.mime_type) == (t.MediaKind.VIDEO, "video/mp4")
    assert (video.width, video.height, video.num_frames, video.fps) == (32, 32, 5, 8.0)
    assert video.sha256 == hashlib.sha256(video.data).hexdigest()
    frames = decoded_frames(video.data)
    assert frames.shape == (5, 32, 32, 3)
    assert np.std(frames.astype(np.float32)) > 1, "not a flat video"
    [wider] = videos["64x32x9"].artifacts
    assert (wider.width, wider.height, wider.num_frames) == (64, 32, 9)
    assert decoded_frames(wider.data).shape == (9, 32, 64, 3)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    first, again, other = (videos[key].artifacts[0].sha256 for key in ("first", "again", "other-seed"))
    assert first == again
    assert first != other


def test_the_prompt_and_the_negative_prompt_change_the_video(videos: dict[str, t.GenerateResult]) -> None:
    # Past the template's 128-token crop: the user prompt reaches the transformer.
    assert pixel_difference(videos["first"], videos["other-prompt"]) > 1
    # guidance_scale 5 > 1: the unconditional pass is the negative prompt's.
    assert pixel_difference(videos["first"], videos["negative"]) > 1


@pytest.mark.parametrize(("asked", "made"), [(8, 9), (6, 5)])
def test_the_pipeline_rounds_a_frame_count_off_the_grid_and_the_artifact_says_so(
    executor: LegacyCallExecutor, asked: int, made: int
) -> None:
    [video] = only_result(run(executor, num_frames=asked)).artifacts
    assert video.num_frames == made
    assert decoded_frames(video.data).shape[0] == made


def test_two_outputs_are_the_videos_of_two_seeds(
    executor: LegacyCallExecutor, videos: dict[str, t.GenerateResult]
) -> None:
    result = only_result(run(executor, num_outputs=2))
    assert [video.seed for video in result.artifacts] == [7, 8]
    # One call of two videos, each as it is alone.
    assert result.artifacts[0].sha256 == videos["first"].artifacts[0].sha256
    assert result.artifacts[1].sha256 == videos["other-seed"].artifacts[0].sha256


@pytest.mark.parametrize(("field", "value"), [("width", 40), ("height", 24)])
def test_a_size_off_the_16_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    outcome = run(executor, **{field: value})
    assert refusal(outcome) == ("INVALID_ARGUMENT", field)
    assert outcome.error is not None and "multiple of 16" in outcome.error.message


# ---- text2image: Kandinsky5T2IPipeline on builtin:tiny-kandinsky5-t2i -------------------------

# 1024x1024 is one of the pipeline's seven resolutions (it would resize any other size to one).
T2I = Family(
    "tiny-kandinsky5-t2i",
    "Kandinsky5T2IPipeline",
    (t.Task.TEXT2IMAGE,),
    {"width": 1024, "height": 1024, "num_inference_steps": 2, "guidance_scale": 3.5, "seed": 7},
)


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice, seed 8, another prompt, and 1408x640 (another of its resolutions)."""
    return {
        "first": only_result(run_family(executor, T2I)),
        "again": only_result(run_family(executor, T2I)),
        "other-seed": only_result(run_family(executor, T2I, seed=8)),
        "other-prompt": only_result(run_family(executor, T2I, prompt="a blue boat on the sea")),
        "1408x640": only_result(run_family(executor, T2I, width=1408, height=640)),
    }


def test_text2image_runs_the_kandinsky5_image_pipeline(images: dict[str, t.GenerateResult]) -> None:
    result = images["first"]
    assert result.report.pipeline_class == "Kandinsky5T2IPipeline"
    [image] = result.artifacts
    assert (image.kind, image.mime_type, image.width, image.height) == (
        t.MediaKind.IMAGE,
        "image/png",
        1024,
        1024,
    )
    assert pixels(image).shape == (1024, 1024, 3)
    assert np.std(pixels(image)) > 1, "not a flat image"


def test_text2image_seed_and_prompt(images: dict[str, t.GenerateResult]) -> None:
    first, again, other = (images[key].artifacts[0].sha256 for key in ("first", "again", "other-seed"))
    assert first == again
    assert first != other
    difference = np.abs(pixels(images["first"].artifacts[0]) - pixels(images["other-prompt"].artifacts[0]))
    assert difference.mean() > 1


def test_text2image_makes_another_of_its_resolutions_and_refuses_the_rest(
    executor: LegacyCallExecutor, images: dict[str, t.GenerateResult]
) -> None:
    [image] = images["1408x640"].artifacts
    assert (image.width, image.height) == (1408, 640)
    assert pixels(image).shape == (640, 1408, 3)
    # 128x64 (2:1) is none of them: the pipeline would make 1408x640 without a word; refused.
    outcome = run_family(executor, T2I, width=128, height=64)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "width")
    assert outcome.error is not None and "1408x640" in outcome.error.message


def test_text2image_size_off_the_16_grid_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    assert refusal(run_family(executor, T2I, width=1000)) == ("INVALID_ARGUMENT", "width")


# ---- image2video: Kandinsky5I2VPipeline on builtin:tiny-kandinsky5-i2v (the T2V weights) ------

# 17 frames = 5 latent frames, the fewest the pipeline makes without NaN (`normalize_first_frame`).
I2V = Family(
    "tiny-kandinsky5-i2v",
    "Kandinsky5I2VPipeline",
    (t.Task.IMAGE2VIDEO,),
    {
        "width": 32,
        "height": 32,
        "num_frames": 17,
        "fps": 8.0,
        "num_inference_steps": 2,
        "guidance_scale": 5.0,
        "seed": 7,
    },
)


def run_i2v(executor: LegacyCallExecutor, image_seed: int | None = 1, **fields: object) -> ItemOutcome:
    """One image2video job on a 32x32 noise image made from `image_seed` (None: no image)."""
    inputs = () if image_seed is None else ((IMAGE, png_bytes(noise_image(image_seed, (32, 32)))),)
    return run_family(executor, I2V, inputs=inputs, **fields)


@pytest.fixture(scope="module")
def i2v(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Image 1 with seed 7 twice, seed 8, and image 2."""
    return {
        "first": only_result(run_i2v(executor)),
        "again": only_result(run_i2v(executor)),
        "other-seed": only_result(run_i2v(executor, seed=8)),
        "other-image": only_result(run_i2v(executor, 2)),
    }


def first_frame_difference(a: t.GenerateResult, b: t.GenerateResult) -> float:
    # The input image is the first latent frame (not denoised): its frames show it most.
    frames_a, frames_b = (decoded_frames(r.artifacts[0].data)[:4].astype(np.float32) for r in (a, b))
    return float(np.abs(frames_a - frames_b).mean())


def test_image2video_runs_the_kandinsky5_image_to_video_pipeline(i2v: dict[str, t.GenerateResult]) -> None:
    report = i2v["first"].report
    assert (report.task, report.pipeline_class) == (t.Task.IMAGE2VIDEO, "Kandinsky5I2VPipeline")
    check_video(i2v["first"].artifacts[0], 32, 32, 17)


def test_image2video_repeats_with_the_seed_and_depends_on_the_image(i2v: dict[str, t.GenerateResult]) -> None:
    first, again, other_seed, other_image = (
        i2v[key].artifacts[0].sha256 for key in ("first", "again", "other-seed", "other-image")
    )
    assert first == again
    assert first not in (other_seed, other_image)
    assert pixel_difference(i2v["first"], i2v["other-seed"]) > 1
    assert first_frame_difference(i2v["first"], i2v["other-image"]) > 1


def test_image2video_without_an_image_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    outcome = run_i2v(executor, None)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "inputs")
    assert outcome.error is not None and "role image" in outcome.error.message


@pytest.mark.parametrize("frames", [1, 5, 13])
def test_image2video_under_17_frames_is_invalid_argument(executor: LegacyCallExecutor, frames: int) -> None:
    outcome = run_i2v(executor, num_frames=frames)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "num_frames")
    assert outcome.error is not None and "at least 17" in outcome.error.message


# ---- image2image: Kandinsky5I2IPipeline on builtin:tiny-kandinsky5-i2i -------------------------

I2I = Family(
    "tiny-kandinsky5-i2i",
    "Kandinsky5I2IPipeline",
    (t.Task.IMAGE2IMAGE,),
    {"width": 1024, "height": 1024, "num_inference_steps": 2, "guidance_scale": 3.5, "seed": 7},
)


def run_i2i(executor: LegacyCallExecutor, image_seed: int | None = 1, **fields: object) -> ItemOutcome:
    """One image2image job on a 64x64 noise image made from `image_seed` (None: no image)."""
    inputs = () if image_seed is None else ((IMAGE, png_bytes(noise_image(image_seed))),)
    return run_family(executor, I2I, inputs=inputs, **fields)


@pytest.fixture(scope="module")
def i2i(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Image 1 with seed 7 twice, seed 8, and image 2."""
    return {
        "first": only_result(run_i2i(executor)),
        "again": only_result(run_i2i(executor)),
        "other-seed": only_result(run_i2i(executor, seed=8)),
        "other-image": only_result(run_i2i(executor, 2)),
    }


def test_image2image_runs_the_kandinsky5_image_to_image_pipeline(i2i: dict[str, t.GenerateResult]) -> None:
    report = i2i["first"].report
    assert (report.task, report.pipeline_class) == (t.Task.IMAGE2IMAGE, "Kandinsky5I2IPipeline")
    check_image(i2i["first"].artifacts[0], 1024, 1024)


def test_image2image_repeats_with_the_seed_and_depends_on_the_image(i2i: dict[str, t.GenerateResult]) -> None:
    first, again, other_seed, other_image = (
        i2i[key].artifacts[0].sha256 for key in ("first", "again", "other-seed", "other-image")
    )
    assert first == again
    assert first not in (other_seed, other_image)
    image = pixels(i2i["first"].artifacts[0])
    assert np.abs(image - pixels(i2i["other-seed"].artifacts[0])).mean() > 1
    assert np.abs(image - pixels(i2i["other-image"].artifacts[0])).mean() > 1


def test_image2image_without_an_image_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    outcome = run_i2i(executor, None)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "inputs")
    assert outcome.error is not None and "role image" in outcome.error.message


def test_image2image_off_its_resolutions_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    assert refusal(run_i2i(executor, width=512, height=512)) == ("INVALID_ARGUMENT", "width")
