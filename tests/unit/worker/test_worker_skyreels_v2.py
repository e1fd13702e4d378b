"""SkyReels-V2 through the real legacy_call executor, on `builtin:tiny-skyreels-v2`,
`tiny-skyreels-v2-i2v` and `tiny-skyreels-v2-df`.

SkyReels-V2 is built on Wan 2.1's parts: sizes multiples of 16, frame counts off 4k+1 rounded by
the pipeline (not refused; the artifact reports the frames the video really has). Only the
diffusion-forcing (long-video) pipeline takes the frame rate, and its model knows two: 16 fps
and any other. A video longer than its `base_num_frames` window needs `extra.overlap_history`.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageSequence
from worker_testing import (
    IMAGE,
    Family,
    check_seeded,
    check_video,
    decoded_frames,
    noise_image,
    only_result,
    png_bytes,
    refusal,
    run_family,
)

from omnirt import types as t
from omnirt.v1 import types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

# 64x64, 9 frames (3 latent frames), 2 steps.
DEFAULTS = {
    "width": 64,
    "height": 64,
    "num_frames": 9,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 5.0,
    "seed": 7,
}
T2V = Family("tiny-skyreels-v2", "SkyReelsV2Pipeline", (t.Task.TEXT2VIDEO,), DEFAULTS)
I2V = Family("tiny-skyreels-v2-i2v", "SkyReelsV2ImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), DEFAULTS)
DF = Family("tiny-skyreels-v2-df", "SkyReelsV2DiffusionForcingPipeline", (t.Task.TEXT2VIDEO,), DEFAULTS)


def image_input(image: Image.Image) -> tuple[tuple[int, bytes], ...]:
    return ((IMAGE, png_bytes(image)),)


RED = image_input(Image.new("RGB", (64, 64), "red"))
# GIF frames are the pipeline's frames (palette-quantized alike): equal frames, equal pixels,
# whatever the frame rate (H.264's rate control differs with it).
GIF = types_pb2.OutputOptions(format="gif")


def gif_frames(result: t.GenerateResult) -> np.ndarray:
    with Image.open(io.BytesIO(result.artifacts[0].data)) as gif:
        return np.stack([np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(gif)])


def frames_of(result: t.GenerateResult) -> np.ndarray:
    return decoded_frames(result.artifacts[0].data).astype(np.float32)


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """tiny-skyreels-v2 text2video: seed 7 twice, seed 8, and seed 7 as GIFs at 8 and 16 fps."""
    return {
        "first": only_result(run_family(executor, T2V)),
        "again": only_result(run_family(executor, T2V)),
        "other-seed": only_result(run_family(executor, T2V, seed=8)),
        "gif-8-fps": only_result(run_family(executor, T2V, output=GIF)),
        "gif-16-fps": only_result(run_family(executor, T2V, fps=16.0, output=GIF)),
    }


def test_text2video_runs_the_skyreels_v2_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "SkyReelsV2Pipeline"
    assert report.config_resolved["num_frames"] == 9


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 64, 64, 9)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


def test_the_text2video_model_only_exports_at_the_frame_rate(videos: dict[str, t.GenerateResult]) -> None:
    # SkyReelsV2Pipeline takes no fps: the same frames, played faster.
    slow, fast = videos["gif-8-fps"], videos["gif-16-fps"]
    assert (fast.artifacts[0].fps, fast.artifacts[0].duration_ms) == (16.0, round(9 * 1000 / 16))
    assert slow.artifacts[0].sha256 != fast.artifacts[0].sha256  # the GIF's frame time
    assert gif_frames(fast).shape == (9, 64, 64, 3)
    assert np.array_equal(gif_frames(slow), gif_frames(fast))


@pytest.mark.parametrize(("asked", "made"), [(8, 9), (16, 17)])
def test_a_frame_count_off_the_grid_is_rounded_and_reported_as_made(
    executor: LegacyCallExecutor, asked: int, made: int
) -> None:
    # The OpenAI video route asks for seconds x fps frames (2 s at 8 fps = 16): SkyReels rounds it.
    for family in (T2V, DF):
        result = only_result(run_family(executor, family, num_frames=asked, width=32, height=32))
        [video] = result.artifacts
        assert video.num_frames == made == len(decoded_frames(video.data))
        assert result.report.config_resolved["num_frames"] == made
        assert video.duration_ms == round(made * 1000 / 8.0)


@pytest.mark.parametrize(("field", "value"), [("width", 72), ("height", 40)])
def test_a_size_off_the_16_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    for family, inputs in ((T2V, ()), (I2V, RED), (DF, ())):
        outcome = run_family(executor, family, inputs=inputs, **{field: value})
        assert refusal(outcome) == ("INVALID_ARGUMENT", field), family.model
        assert outcome.error is not None and "multiple of 16" in outcome.error.message


# ---- image-to-video: the first frame through the VAE and a CLIP image encoder -----------------


@pytest.fixture(scope="module")
def i2v_videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    return {
        "red": only_result(run_family(executor, I2V, inputs=RED)),
        "red-again": only_result(run_family(executor, I2V, inputs=RED)),
        "noisy": only_result(run_family(executor, I2V, inputs=image_input(noise_image(8)))),
    }


def test_image2video_runs_the_skyreels_v2_i2v_pipeline(i2v_videos: dict[str, t.GenerateResult]) -> None:
    result = i2v_videos["red"]
    assert result.report.task is t.Task.IMAGE2VIDEO
    assert result.report.pipeline_class == "SkyReelsV2ImageToVideoPipeline"
    [video] = result.artifacts
    assert (video.width, video.height, video.num_frames) == (64, 64, 9)
    assert decoded_frames(video.data).shape == (9, 64, 64, 3)


def test_image2video_depends_on_its_image(i2v_videos: dict[str, t.GenerateResult]) -> None:
    red, again, noisy = (i2v_videos[key] for key in ("red", "red-again", "noisy"))
    assert red.artifacts[0].sha256 == again.artifacts[0].sha256
    assert np.abs(frames_of(red) - frames_of(noisy)).mean() > 2, "another input image must change the video"


# ---- diffusion forcing: the frame rate conditions the model; long videos in windows -----------


@pytest.fixture(scope="module")
def df_videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    return {
        "24-fps": only_result(run_family(executor, DF, fps=24.0)),
        "24-fps-again": only_result(run_family(executor, DF, fps=24.0)),
        "other-seed": only_result(run_family(executor, DF, fps=24.0, seed=8)),
        "gif-24-fps": only_result(run_family(executor, DF, fps=24.0, output=GIF)),
        "gif-30-fps": only_result(run_family(executor, DF, fps=30.0, output=GIF)),
        "gif-16-fps": only_result(run_family(executor, DF, fps=16.0, output=GIF)),
    }


def test_diffusion_forcing_runs_its_pipeline(df_videos: dict[str, t.GenerateResult]) -> None:
    result = df_videos["24-fps"]
    assert result.report.pipeline_class == "SkyReelsV2DiffusionForcingPipeline"
    [video] = result.artifacts
    assert (video.width, video.height, video.num_frames, video.fps) == (64, 64, 9, 24.0)
    assert decoded_frames(video.data).shape == (9, 64, 64, 3)
    same, other = df_videos["24-fps-again"].artifacts[0], df_videos["other-seed"].artifacts[0]
    assert video.sha256 == same.sha256 != other.sha256


def test_diffusion_forcing_conditions_on_the_frame_rate(df_videos: dict[str, t.GenerateResult]) -> None:
    at_24, at_30, at_16 = (gif_frames(df_videos[f"gif-{fps}-fps"]) for fps in (24, 30, 16))
    assert not np.array_equal(at_24, at_16), "16 fps and 24 fps are two embeddings of the model"
    # The model knows two rates: 16 fps and any other (diffusers embeds fps != 16 as 24's).
    assert np.array_equal(at_24, at_30)


def test_a_video_longer_than_the_window_runs_with_an_overlap(executor: LegacyCallExecutor) -> None:
    long = only_result(
        run_family(executor, DF, num_frames=17, extra={"base_num_frames": 9, "overlap_history": 5})
    )
    [video] = long.artifacts
    assert video.num_frames == 17 == len(decoded_frames(video.data))
    assert long.report.config_resolved["overlap_history"] == 5


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"base_num_frames": 9}, "num_frames 17 > base_num_frames 9"),
        ({"base_num_frames": 9, "overlap_history": 9}, "from 1 to 8"),
        ({"base_num_frames": 9, "overlap_history": "long"}, "from 1 to 8"),
    ],
    ids=["no-overlap", "a-whole-window", "not-a-number"],
)
def test_a_long_video_without_a_usable_overlap_is_invalid_argument(
    executor: LegacyCallExecutor, extra: dict[str, object], message: str
) -> None:
    outcome = run_family(executor, DF, num_frames=17, extra=extra)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.overlap_history")
    assert outcome.error is not None and message in outcome.error.message


def test_the_default_window_is_97_frames(executor: LegacyCallExecutor) -> None:
    # No base_num_frames in the request: the pipeline's own default (97 frames, the 540P models').
    outcome = run_family(executor, DF, num_frames=101, width=16, height=16)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.overlap_history")
    assert outcome.error is not None and "base_num_frames 97" in outcome.error.message
