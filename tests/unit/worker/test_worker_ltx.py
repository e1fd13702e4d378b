"""LTX-Video text2video through the real legacy_call executor, on `builtin:tiny-ltx-video`.

LTX-Video compresses 32x in space and 8x in time (the tiny model keeps both): sizes must be
multiples of 32 and frame counts 8k+1. A request off either grid is INVALID_ARGUMENT naming the
field, never INTERNAL (the pipeline's own ValueError) nor a video with other frames than asked.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from worker_testing import Family, decoded_frames, only_result, run_family

from omnirt import types as t
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.protocol import ItemOutcome

# 64x64 (2x2 latents), 9 frames = 2 latent frames, 2 steps.
LTX = Family(
    "tiny-ltx-video",
    "LTXPipeline",
    (t.Task.TEXT2VIDEO,),
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
    [video] = videos["first"].artifacts
    assert (video.kind, video.mime_type) == (t.MediaKind.VIDEO, "video/mp4")
    assert (video.width, video.height, video.num_frames, video.fps) == (64, 64, 9, 8.0)
    assert video.sha256 == hashlib.sha256(video.data).hexdigest()
    frames = decoded_frames(video.data)
    assert frames.shape == (9, 64, 64, 3)
    assert np.std(frames.astype(np.float32)) > 1, "not a flat video"


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    first, again, other = (videos[key].artifacts[0].sha256 for key in ("first", "again", "other-seed"))
    assert first == again
    assert first != other


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
