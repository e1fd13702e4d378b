"""Mochi text2video through the real legacy_call executor, on `builtin:tiny-mochi`.

Mochi's VAE compresses 8x in space and 6x in time and its transformer takes 2x2 patches: sizes
must be multiples of 16 and frame counts 6k+1. A request off either grid is INVALID_ARGUMENT
naming the field, never INTERNAL nor a video with other frames than asked.
"""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
from worker_testing import check_seeded, check_video, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

MODEL = "tiny-mochi"
# 32x32 (4x4 latents, 2x2 patches), 7 frames = 2 latent frames, 2 steps.
DEFAULTS = {
    "width": 32,
    "height": 32,
    "num_frames": 7,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 4.5,
    "seed": 7,
}


def run(executor: LegacyCallExecutor, **fields: object) -> ItemOutcome:
    """One text2video job on tiny Mochi, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-mochi",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="MochiPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_TEXT2VIDEO],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_TEXT2VIDEO, model=MODEL, prompt="a red fox", **{**DEFAULTS, **fields}
    )
    msg.items.add(job_id="job-1", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def only_result(outcome: ItemOutcome) -> t.GenerateResult:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return outcome.result


def decoded_frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice and seed 8 once."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
    }


def test_text2video_runs_the_mochi_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "MochiPipeline"
    assert report.config_resolved["num_frames"] == 7


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 32, 32, 7)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


# 40 and 24 are multiples of the VAE factor 8 (the pipeline's own check) but not of 8 x patch 2.
@pytest.mark.parametrize(("field", "value"), [("width", 40), ("height", 24)])
def test_a_size_off_the_16_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int
) -> None:
    outcome = run(executor, **{field: value})
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", field)
    assert "multiple of 16" in outcome.error.message


@pytest.mark.parametrize("num_frames", [8, 9])
def test_frames_off_the_6k_plus_1_grid_are_invalid_argument(
    executor: LegacyCallExecutor, num_frames: int
) -> None:
    outcome = run(executor, num_frames=num_frames)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "num_frames")
    assert "6k+1" in outcome.error.message


def test_a_frame_count_on_the_grid_runs(executor: LegacyCallExecutor) -> None:
    [video] = only_result(run(executor, num_frames=13, width=48, height=16)).artifacts
    assert (video.num_frames, video.width, video.height) == (13, 48, 16)
