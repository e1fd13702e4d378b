"""Wan 2.2 through the real legacy_call executor, on `builtin:tiny-wan22`, `tiny-wan22-i2v` and
`tiny-wan22-ti2v`.

The A14B models denoise with two experts: `transformer` above the pipeline's `boundary_ratio`
(the high-noise steps), `transformer_2` below it. A user notices both: the video differs from
what either expert makes alone with the same seed, and `extra.guidance_scale_2` (the low-noise
expert's guidance) changes it. The TI2V-5B layout (`expand_timesteps`, a 16x VAE of 48 channels)
makes sizes multiples of 32. Frame counts off 4k+1 are rounded by the pipeline (not refused):
the artifact reports the frames the video really has.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    TASKS,
    Family,
    check_seeded,
    check_video,
    decoded_frames,
    noise_image,
    only_result,
    png_bytes,
    refusal,
    run_assignment,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny.registry import ensure_builtin

# 64x64, 9 frames (3 latent frames), 2 steps: timesteps 999 (high-noise expert) and 750 (low).
DEFAULTS = {
    "width": 64,
    "height": 64,
    "num_frames": 9,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 5.0,
    "seed": 7,
}
T2V = Family("tiny-wan22", "WanPipeline", (t.Task.TEXT2VIDEO,), DEFAULTS)
I2V = Family("tiny-wan22-i2v", "WanImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), DEFAULTS)
# TI2V-5B: one model for both tasks (image2video runs WanImageToVideoPipeline on its modules), or
# its folder loaded as a WanImageToVideoPipeline.
TI2V = Family("tiny-wan22-ti2v", "WanPipeline", (t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO), DEFAULTS)
TI2V_I2V = Family("tiny-wan22-ti2v", "WanImageToVideoPipeline", (t.Task.IMAGE2VIDEO,), DEFAULTS)
WAN21 = Family("tiny-wan", "WanPipeline", (t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO), DEFAULTS)


def image_input(image: Image.Image) -> tuple[tuple[int, bytes], ...]:
    return ((IMAGE, png_bytes(image)),)


RED = image_input(Image.new("RGB", (64, 64), "red"))


def run_from(
    executor: LegacyCallExecutor,
    family: Family,
    source: Path,
    *,
    inputs: tuple[tuple[int, bytes], ...] = (),
    **fields: object,
) -> ItemOutcome:
    """One job of `family`'s first task on the model saved at `source` (a local folder)."""
    task = family.tasks[0]
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-{source.name}",
        model=models_pb2.ModelSpec(
            id=source.name,
            source=str(source),
            pipeline_class=family.pipeline_class,
            execution_mode="legacy_call",
            tasks=[TASKS[task]],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=TASKS[task], model=source.name, prompt="a red fox", **{**family.defaults, **fields}
    )
    for role, data in inputs:
        request.inputs.add(role=role, data=data)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


@pytest.fixture(scope="module")
def single_experts(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each A14B model's experts alone, as one-transformer (Wan 2.1-style) models of the same
    other weights: `{model}-high` runs `transformer` at every step, `{model}-low` `transformer_2`."""
    from diffusers import WanImageToVideoPipeline, WanPipeline

    root = tmp_path_factory.mktemp("single-experts")
    made: dict[str, Path] = {}
    for family, cls in ((T2V, WanPipeline), (I2V, WanImageToVideoPipeline)):
        pipeline = cls.from_pretrained(str(ensure_builtin(family.model, model_dir)))
        parts = {k: v for k, v in pipeline.components.items() if k not in ("transformer", "transformer_2")}
        for name, expert in (("high", pipeline.transformer), ("low", pipeline.transformer_2)):
            target = root / f"{family.model}-{name}"
            cls(**parts, transformer=expert).save_pretrained(str(target))
            made[target.name] = target
    return made


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """tiny-wan22 text2video: seed 7 twice, seed 8, and seed 7 with its low-noise guidance at 1."""
    return {
        "first": only_result(run_family(executor, T2V)),
        "again": only_result(run_family(executor, T2V)),
        "other-seed": only_result(run_family(executor, T2V, seed=8)),
        "low-guidance": only_result(run_family(executor, T2V, extra={"guidance_scale_2": 1.0})),
    }


def test_text2video_runs_the_two_expert_wan_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "WanPipeline"
    assert (report.config_resolved["num_frames"], report.config_resolved["fps"]) == (9, 8.0)


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 64, 64, 9)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


@pytest.mark.parametrize(("family", "inputs"), [(T2V, ()), (I2V, RED)], ids=["text2video", "image2video"])
def test_both_experts_make_the_video(
    executor: LegacyCallExecutor,
    single_experts: dict[str, Path],
    family: Family,
    inputs: tuple[tuple[int, bytes], ...],
) -> None:
    both = only_result(run_family(executor, family, inputs=inputs)).artifacts[0]
    high, low = (
        only_result(run_from(executor, family, single_experts[f"{family.model}-{name}"], inputs=inputs))
        for name in ("high", "low")
    )
    assert high.report.pipeline_class == low.report.pipeline_class == family.pipeline_class
    hashes = {both.sha256, high.artifacts[0].sha256, low.artifacts[0].sha256}
    assert len(hashes) == 3, "the two-expert video must differ from each expert's alone"
    difference = np.abs(
        decoded_frames(both.data).astype(np.float32) - decoded_frames(high.artifacts[0].data)
    ).mean()
    assert difference > 2, "the low-noise expert must change the pixels, not only the bytes"


def test_low_noise_guidance_changes_the_video(videos: dict[str, t.GenerateResult]) -> None:
    changed = videos["low-guidance"]
    assert changed.report.config_resolved["guidance_scale_2"] == 1
    assert changed.artifacts[0].sha256 != videos["first"].artifacts[0].sha256


def test_low_noise_guidance_on_a_one_transformer_wan_is_invalid_argument(
    executor: LegacyCallExecutor,
) -> None:
    # Wan 2.1's WanPipeline takes guidance_scale_2 but raises a ValueError for it: refused first.
    outcome = run_family(executor, WAN21, extra={"guidance_scale_2": 1.0})
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.guidance_scale_2")
    assert outcome.error is not None and "one transformer" in outcome.error.message


def test_low_noise_guidance_must_be_a_number(executor: LegacyCallExecutor) -> None:
    outcome = run_family(executor, T2V, extra={"guidance_scale_2": "high"})
    assert refusal(outcome) == ("INVALID_ARGUMENT", "extra.guidance_scale_2")
    assert outcome.error is not None and "a number" in outcome.error.message


@pytest.mark.parametrize(("asked", "made"), [(8, 9), (16, 17)])
def test_a_frame_count_off_the_grid_is_rounded_and_reported_as_made(
    executor: LegacyCallExecutor, asked: int, made: int
) -> None:
    # The OpenAI video route asks for seconds x fps frames (2 s at 8 fps = 16): Wan rounds it.
    result = only_result(run_family(executor, T2V, num_frames=asked, width=32, height=32))
    [video] = result.artifacts
    assert video.num_frames == made == len(decoded_frames(video.data))
    assert result.report.config_resolved["num_frames"] == made
    assert video.duration_ms == round(made * 1000 / 8.0)


@pytest.mark.parametrize(("field", "value"), [("width", 72), ("height", 40)])
def test_a_size_off_the_16_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    for family, inputs in ((T2V, ()), (I2V, RED)):
        outcome = run_family(executor, family, inputs=inputs, **{field: value})
        assert refusal(outcome) == ("INVALID_ARGUMENT", field)
        assert outcome.error is not None and "multiple of 16" in outcome.error.message


# ---- image-to-video A14B ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def i2v_videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    noisy = image_input(noise_image(8))
    return {
        "red": only_result(run_family(executor, I2V, inputs=RED)),
        "red-again": only_result(run_family(executor, I2V, inputs=RED)),
        "noisy": only_result(run_family(executor, I2V, inputs=noisy)),
    }


def test_image2video_runs_the_wan_i2v_pipeline(i2v_videos: dict[str, t.GenerateResult]) -> None:
    result = i2v_videos["red"]
    assert result.report.task is t.Task.IMAGE2VIDEO
    assert result.report.pipeline_class == "WanImageToVideoPipeline"
    [video] = result.artifacts
    assert (video.width, video.height, video.num_frames) == (64, 64, 9)
    assert decoded_frames(video.data).shape == (9, 64, 64, 3)


def test_image2video_depends_on_its_image(i2v_videos: dict[str, t.GenerateResult]) -> None:
    red, again, noisy = (i2v_videos[key].artifacts[0] for key in ("red", "red-again", "noisy"))
    assert red.sha256 == again.sha256
    difference = np.abs(decoded_frames(red.data).astype(np.float32) - decoded_frames(noisy.data)).mean()
    assert difference > 2, "another input image must change the video"


# ---- TI2V-5B: expand_timesteps, a 16x VAE of 48 channels --------------------------------------


def test_ti2v_text2video_makes_the_requested_video(executor: LegacyCallExecutor) -> None:
    first = only_result(run_family(executor, TI2V))
    again, other = only_result(run_family(executor, TI2V)), only_result(run_family(executor, TI2V, seed=8))
    assert first.report.pipeline_class == "WanPipeline"
    [video] = first.artifacts
    assert (video.width, video.height, video.num_frames) == (64, 64, 9)
    assert decoded_frames(video.data).shape == (9, 64, 64, 3)
    assert first.artifacts[0].sha256 == again.artifacts[0].sha256 != other.artifacts[0].sha256


def test_ti2v_image2video_depends_on_its_image(executor: LegacyCallExecutor) -> None:
    red = only_result(run_family(executor, TI2V_I2V, inputs=RED))
    noisy = only_result(run_family(executor, TI2V_I2V, inputs=image_input(noise_image(8))))
    assert red.report.pipeline_class == "WanImageToVideoPipeline"
    assert red.report.task is t.Task.IMAGE2VIDEO
    red_frames, noisy_frames = (decoded_frames(r.artifacts[0].data).astype(np.float32) for r in (red, noisy))
    assert red_frames.shape == (9, 64, 64, 3)
    assert np.abs(red_frames - noisy_frames).mean() > 2, "another input image must change the video"


def test_ti2v_image2video_on_the_text_to_video_model_shares_its_modules(
    executor: LegacyCallExecutor,
) -> None:
    # The model is loaded once, as WanPipeline; image2video runs WanImageToVideoPipeline on its
    # modules, the same video as the folder loaded as a WanImageToVideoPipeline.
    derived = only_result(run_family(executor, TI2V, t.Task.IMAGE2VIDEO, inputs=RED))
    loaded = only_result(run_family(executor, TI2V_I2V, inputs=RED))
    assert derived.report.task is t.Task.IMAGE2VIDEO
    assert derived.report.pipeline_class == "WanImageToVideoPipeline"
    assert derived.artifacts[0].sha256 == loaded.artifacts[0].sha256
    text = only_result(run_family(executor, TI2V))
    assert derived.artifacts[0].sha256 != text.artifacts[0].sha256


def test_image2video_on_a_wan21_text_to_video_model_is_refused(executor: LegacyCallExecutor) -> None:
    # Wan 2.1's transformer takes no image channels: no image-to-video pipeline on its modules.
    outcome = run_family(executor, WAN21, t.Task.IMAGE2VIDEO, inputs=RED)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "inputs[0]")


@pytest.mark.parametrize(("field", "value"), [("width", 48), ("height", 80)])
def test_ti2v_size_off_the_32_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    outcome = run_family(executor, TI2V, **{field: value})
    assert refusal(outcome) == ("INVALID_ARGUMENT", field)
    assert outcome.error is not None and "multiple of 32" in outcome.error.message
