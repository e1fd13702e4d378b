"""HunyuanVideo text2video through the real legacy_call executor, on `builtin:tiny-hunyuan-video`.

The pipeline wraps each prompt in its default Llama 3 chat template and crops a fixed 95 tokens
from the front: the offline Llama tokenizer must keep the user prompt past that crop, so the
prompt changes the video. A size or frame count off the VAE's grid is INVALID_ARGUMENT naming
the field, never INTERNAL.
"""

from __future__ import annotations

import io
from pathlib import Path

import av
import numpy as np
import pytest
from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video import DEFAULT_PROMPT_TEMPLATE
from worker_testing import check_seeded, check_video, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny import tokenizers

MODEL = "tiny-hunyuan-video"
# 32x32 (a multiple of 16: VAE factor 8 x patch 2), 9 frames = 3 latent frames, 2 steps.
DEFAULTS = {
    "width": 32,
    "height": 32,
    "num_frames": 9,
    "fps": 8.0,
    "num_inference_steps": 2,
    "guidance_scale": 6.0,
    "seed": 7,
}


def run(executor: LegacyCallExecutor, prompt: str = "a red fox", **fields: object) -> ItemOutcome:
    """One text2video job on tiny HunyuanVideo, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-hunyuan-video",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="HunyuanVideoPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_TEXT2VIDEO],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_TEXT2VIDEO, model=MODEL, prompt=prompt, **{**DEFAULTS, **fields}
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
    """Seed 7 twice, seed 8 once, and seed 7 with another prompt."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "other-prompt": only_result(run(executor, prompt="a blue boat on the sea")),
    }


def test_text2video_runs_the_hunyuan_video_pipeline(videos: dict[str, t.GenerateResult]) -> None:
    report = videos["first"].report
    assert report.task is t.Task.TEXT2VIDEO
    assert report.pipeline_class == "HunyuanVideoPipeline"
    assert report.config_resolved["num_frames"] == 9


def test_video_has_the_requested_frames_and_size(videos: dict[str, t.GenerateResult]) -> None:
    check_video(videos["first"].artifacts[0], 32, 32, 9)


def test_same_seed_same_bytes_other_seed_other_video(videos: dict[str, t.GenerateResult]) -> None:
    check_seeded(videos)


def test_the_prompt_survives_the_template_crop(videos: dict[str, t.GenerateResult]) -> None:
    assert videos["first"].artifacts[0].sha256 != videos["other-prompt"].artifacts[0].sha256


def test_the_llama_tokenizer_keeps_the_prompt_past_the_crop_and_round_trips(tmp_path: Path) -> None:
    tokenizer = tokenizers.llama_tokenizer()
    template, crop = DEFAULT_PROMPT_TEMPLATE["template"], DEFAULT_PROMPT_TEMPLATE["crop_start"]
    ids = tokenizer(template.format("a red fox"))["input_ids"]
    prefix = tokenizer(template.split("{}")[0])["input_ids"]
    # The crop removes only template tokens, and the prompt fits the pipeline's 256 + crop window.
    assert crop <= len(prefix) < len(ids) <= 256 + crop
    assert ids[0] == tokenizer.bos_token_id
    assert "<|eot_id|>" in tokenizer.convert_ids_to_tokens(ids)
    tokenizer.save_pretrained(str(tmp_path))
    loaded = type(tokenizer).from_pretrained(str(tmp_path))
    assert loaded(template.format("a red fox"))["input_ids"] == ids
    assert loaded.padding_side == "right"
    assert loaded.decode(loaded("a red fox\n")["input_ids"], skip_special_tokens=True) == "a red fox\n"


@pytest.mark.parametrize(
    ("field", "value", "needs"),
    [("width", 40, "multiple of 16"), ("height", 24, "multiple of 16"), ("num_frames", 8, "4k+1")],
)
def test_off_the_vae_grid_is_invalid_argument(
    executor: LegacyCallExecutor, field: str, value: int, needs: str
) -> None:
    outcome = run(executor, **{field: value})
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", field)
    assert needs in outcome.error.message
