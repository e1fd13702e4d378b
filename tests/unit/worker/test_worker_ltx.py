"""LTX-Video text2video and image2video through the real legacy_call executor, on
`builtin:tiny-ltx-video`.

LTX-Video compresses 32x in space and 8x in time (the tiny model keeps both): sizes must be
multiples of 32 and frame counts 8k+1. A request off either grid is INVALID_ARGUMENT naming the
field, never INTERNAL (the pipeline's own ValueError) nor a video with other frames than asked.
image2video on the same model runs `LTXImageToVideoPipeline` made with `from_pipe` from the
loaded `LTXPipeline` (the same weights, loaded once). The request's fps reaches LTX as its
`frame_rate`, which scales the time axis of its RoPE: the frame rate changes the video.
"""

from __future__ import annotations

import numpy as np
import pytest
from worker_testing import (
    IMAGE,
    Family,
    check_seeded,
    check_video,
    decoded_frames,
    noise_image,
    only_result,
    png_bytes,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.args import call_kwargs

# 64x64 (2x2 latents), 9 frames = 2 latent frames, 2 steps.
LTX = Family(
    "tiny-ltx-video",
    "LTXPipeline",
    (t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO),
    {
        "width": 64,
        "height": 64,
        "num_frames": 9,
        "fps": 8.0,
        "num_inference_steps": 2,
        "guidance_scale": 3.0,
        "seed": 7,
    },
)


def run(executor: LegacyCallExecutor, **fields: object) -> ItemOutcome:
    return run_family(executor, LTX, **fields)


def run_i2v(executor: LegacyCallExecutor, image_seed: int, **fields: object) -> ItemOutcome:
    """One image2video job on a 64x64 noise image made from `image_seed`."""
    image = png_bytes(noise_image(image_seed))
    return run_family(executor, LTX, t.Task.IMAGE2VIDEO, inputs=((IMAGE, image),), **fields)


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice and seed 8 once."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
    }


def test_text2video_runs_the_ltx_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "LTXPipeline"
    assert report.config_resolved["num_frames"] == 9


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 64, 64, 9)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


@pytest.mark.parametrize(("field", "value"), [("width", 48), ("height", 80)])
def test_a_size_off_the_32_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    outcome = run(executor, **{field: value})
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", field)
    assert "multiple of 32" in outcome.error.message


@pytest.mark.parametrize("num_frames", [8, 12])
def test_frames_off_the_8k_plus_1_grid_are_invalid_argument(
    executor: LegacyCallExecutor, num_frames: int
) -> None:
    outcome = run(executor, num_frames=num_frames)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "num_frames")
    assert "8k+1" in outcome.error.message


def test_a_frame_count_on_the_grid_runs(executor: LegacyCallExecutor) -> None:
    [video] = only_result(run(executor, num_frames=17, width=32, height=32)).artifacts
    assert (video.num_frames, video.width, video.height) == (17, 32, 32)


@pytest.fixture(scope="module")
def i2v(executor: LegacyCallExecutor, videos: dict[str, t.GenerateResult]) -> dict[str, t.GenerateResult]:
    """image2video (after text2video loaded the model): image 1 twice, image 2, image 1 at 17 frames."""
    return {
        "first": only_result(run_i2v(executor, 1)),
        "again": only_result(run_i2v(executor, 1)),
        "other-image": only_result(run_i2v(executor, 2)),
        "17-frames": only_result(run_i2v(executor, 1, num_frames=17, width=96, height=32)),
    }


def test_image2video_runs_the_ltx_image_to_video_pipeline_on_the_loaded_weights(
    i2v: dict[str, t.GenerateResult],
) -> None:
    report = i2v["first"].report
    assert report.task is t.Task.IMAGE2VIDEO
    assert report.pipeline_class == "LTXImageToVideoPipeline"
    # text2video loaded the model first: image2video reuses it, no second load.
    assert report.cold_start is False


def test_image2video_has_the_requested_frames_and_size(i2v: dict[str, t.GenerateResult]) -> None:
    [video] = i2v["first"].artifacts
    assert (video.width, video.height, video.num_frames, video.fps) == (64, 64, 9, 8.0)
    assert decoded_frames(video.data).shape == (9, 64, 64, 3)
    [longer] = i2v["17-frames"].artifacts
    assert (longer.width, longer.height, longer.num_frames) == (96, 32, 17)
    assert decoded_frames(longer.data).shape == (17, 32, 96, 3)


def test_image2video_depends_on_the_image_and_repeats_with_the_seed(
    videos: dict[str, t.GenerateResult], i2v: dict[str, t.GenerateResult]
) -> None:
    first, again, other = (i2v[key].artifacts[0] for key in ("first", "again", "other-image"))
    assert first.sha256 == again.sha256
    assert first.sha256 != other.sha256
    # Same seed, prompt and size as the text2video video: only the image conditions it.
    text = decoded_frames(videos["first"].artifacts[0].data).astype(np.float32)
    assert np.abs(decoded_frames(first.data).astype(np.float32) - text).mean() > 1
    assert np.abs(decoded_frames(first.data).astype(np.float32) - decoded_frames(other.data)).mean() > 1


def test_image2video_off_the_grid_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    for field, value in (("width", 48), ("num_frames", 8)):
        outcome = run_i2v(executor, 1, **{field: value})
        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", field)


def test_the_request_fps_is_the_ltx_frame_rate() -> None:
    assert call_kwargs({"fps": 24.0}, frozenset({"frame_rate", "num_frames"})) == {"frame_rate": 24.0}
    assert call_kwargs({"fps": 24.0}, frozenset({"fps", "frame_rate"})) == {"fps": 24.0}


def test_the_frame_rate_changes_the_video(
    executor: LegacyCallExecutor, videos: dict[str, t.GenerateResult]
) -> None:
    result = only_result(run(executor, fps=24.0))
    [video] = result.artifacts
    assert (video.num_frames, video.fps) == (9, 24.0)
    assert result.report.config_resolved["fps"] == 24.0
    # The container's frame rate differs too: compare the pixels, not the bytes.
    at_8 = decoded_frames(videos["first"].artifacts[0].data).astype(np.float32)
    assert np.abs(decoded_frames(video.data).astype(np.float32) - at_8).mean() > 1


def test_extras_may_not_set_the_frame_rate(executor: LegacyCallExecutor) -> None:
    outcome = run(executor, extra={"frame_rate": 30})
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "extra.frame_rate")
