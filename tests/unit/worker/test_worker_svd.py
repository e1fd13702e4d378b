"""Stable Video Diffusion image2video through the real legacy_call executor, on `builtin:tiny-svd`.

SVD's `__call__` takes no prompt and names things its own way (`num_videos_per_prompt`,
`max_guidance_scale`, a conditioning `fps`): the worker passes only what the signature takes,
under its names, and refuses a prompt it would have to drop (INVALID_ARGUMENT naming `prompt`).
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from test_worker_tasks import decoded_frames, noise_image, only_result, png_bytes
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

MODEL = "tiny-svd"
# 48x32 (a multiple of 8; the tiny VAE compresses 2x), 3 frames, 2 steps: about half a second.
DEFAULTS = {
    "width": 48,
    "height": 32,
    "num_frames": 3,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 2.5,
    "seed": 7,
}
RED = png_bytes(Image.new("RGB", (64, 64), "red"))


def run(
    executor: LegacyCallExecutor, *, image: bytes = RED, extra: dict | None = None, **fields: object
) -> list[ItemOutcome]:
    """One image2video job on tiny SVD (no prompt unless given), shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-svd",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="StableVideoDiffusionPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_IMAGE2VIDEO],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_IMAGE2VIDEO, model=MODEL, **{**DEFAULTS, **fields}
    )
    request.inputs.add(role=types_pb2.MEDIA_ROLE_IMAGE, data=image)
    if extra:
        request.extra.update(extra)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


def frames_of(result: t.GenerateResult, index: int = 0) -> np.ndarray:
    return np.stack(decoded_frames(result.artifacts[index].data)).astype(np.float32)


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """The same job twice, and once each with another image, frame rate and guidance."""
    return {
        "red": only_result(run(executor)),
        "red-again": only_result(run(executor)),
        "noise": only_result(run(executor, image=png_bytes(noise_image(3)))),
        "fps16": only_result(run(executor, fps=16.0)),
        "guidance1": only_result(run(executor, guidance_scale=1.0)),
    }


def test_image2video_runs_the_svd_pipeline_at_the_requested_size_and_frames(
    videos: dict[str, t.GenerateResult],
) -> None:
    result = videos["red"]
    [video] = result.artifacts
    assert (video.kind, video.mime_type) == (t.MediaKind.VIDEO, "video/mp4")
    assert (video.width, video.height, video.num_frames, video.fps) == (48, 32, 3, 8.0)
    frames = frames_of(result)
    assert frames.shape == (3, 32, 48, 3)
    assert np.std(frames) > 1, "not a flat video"
    report = result.report
    assert report.task is t.Task.IMAGE2VIDEO
    assert report.pipeline_class == "StableVideoDiffusionPipeline"
    assert report.seeds == [7]


def test_same_seed_same_bytes_and_the_image_conditions_the_video(videos: dict[str, t.GenerateResult]) -> None:
    assert videos["red"].artifacts[0].sha256 == videos["red-again"].artifacts[0].sha256
    assert np.abs(frames_of(videos["red"]) - frames_of(videos["noise"])).mean() > 1


def test_fps_and_guidance_reach_svd_under_its_own_names(videos: dict[str, t.GenerateResult]) -> None:
    # The request's fps is SVD's `fps` micro-conditioning, its guidance_scale `max_guidance_scale`
    # (1 turns classifier-free guidance off): either one changes the frames, not only metadata.
    red = frames_of(videos["red"])
    assert videos["fps16"].artifacts[0].fps == 16.0
    assert np.abs(red - frames_of(videos["fps16"])).mean() > 0.5
    assert np.abs(red - frames_of(videos["guidance1"])).mean() > 0.5


def test_two_outputs_are_num_videos_per_prompt_with_their_own_seeds(executor: LegacyCallExecutor) -> None:
    result = only_result(run(executor, num_outputs=2))
    assert len(result.artifacts) == 2 and result.report.seeds == [7, 8]
    assert [a.num_frames for a in result.artifacts] == [3, 3]
    assert np.abs(frames_of(result, 0) - frames_of(result, 1)).mean() > 0.5


def test_a_prompt_is_invalid_argument_naming_prompt(executor: LegacyCallExecutor) -> None:
    for fields in ({"prompt": "a red fox"}, {"negative_prompt": "blurry"}):
        [outcome] = run(executor, **fields)
        assert outcome.error is not None and outcome.result is None
        [name] = fields
        assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", name)
        assert "takes no" in outcome.error.message and fields[name] not in outcome.error.message


def test_svd_names_are_not_request_extras(executor: LegacyCallExecutor) -> None:
    # They are set from the request's own fields; an extra would race them.
    for name in ("max_guidance_scale", "num_videos_per_prompt", "fps"):
        [outcome] = run(executor, extra={name: 2})
        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", f"extra.{name}")
