"""CogVideoX text2video through the real legacy_call executor, on `builtin:tiny-cogvideox`.

CogVideoX's transformer has an int `patch_size` (Wan's is a tuple): the size check must read
both, and a size off the multiple stays INVALID_ARGUMENT naming the field, never INTERNAL.
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

MODEL = "tiny-cogvideox"
# 32x32 (a multiple of 16: VAE factor 8 x patch 2), 9 frames = 3 latent frames, 2 steps.
DEFAULTS = {
    "width": 32,
    "height": 32,
    "num_frames": 9,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 5.0,
    "seed": 7,
}


def run(executor: LegacyCallExecutor, **fields: object) -> ItemOutcome:
    """One text2video job on tiny CogVideoX, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-cogvideox",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="CogVideoXPipeline",
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


def decoded_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice and seed 8 once."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
    }


def test_text2video_runs_the_cogvideox_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "CogVideoXPipeline"
    assert report.config_resolved["num_frames"] == 9


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 32, 32, 9)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


def test_a_width_off_the_multiple_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    # 40 is a multiple of the VAE factor 8 but not of 8 x patch 2.
    outcome = run(executor, width=40)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "width")
    assert "multiple of 16" in outcome.error.message
