"""Sana text2image through the real legacy_call executor, on `builtin:tiny-sana`.

Sana encodes the prompt with a Gemma-2 model (the offline Gemma tokenizer, with the pipeline's
default complex human instruction prepended) and, by default as the real models, generates at the
nearest bin of its aspect-ratio table and resizes to the requested size. diffusers has no Sana
image-to-image pipeline to derive, so image2image is FAILED_PRECONDITION, never INTERNAL.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_worker_tasks import IMAGE, noise_image, only_result, pixels, png_bytes
from worker_testing import check_image, check_seeded, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny import tokenizers

MODEL = "tiny-sana"
DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 4.5, "seed": 7}


def run(
    executor: LegacyCallExecutor,
    task: int = types_pb2.TASK_TEXT2IMAGE,
    inputs: tuple[tuple[int, bytes], ...] = (),
    **fields: object,
) -> list[ItemOutcome]:
    """One job of `task` on tiny Sana, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-sana",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="SanaPipeline",
            execution_mode="legacy_call",
            tasks=[task],
        ),
    )
    request = types_pb2.GenerateRequest(task=task, model=MODEL, prompt="a red fox", **{**DEFAULTS, **fields})
    for role, data in inputs:
        request.inputs.add(role=role, data=data)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


@pytest.fixture(scope="module")
def images(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice, seed 8 once, and 96x64."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
    }


def test_text2image_runs_the_sana_pipeline_at_the_requested_size(images: dict[str, t.GenerateResult]) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert result.report.task is t.Task.TEXT2IMAGE
    assert result.report.pipeline_class == "SanaPipeline"
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_image2image_is_failed_precondition(executor: LegacyCallExecutor) -> None:
    [outcome] = run(executor, types_pb2.TASK_IMAGE2IMAGE, inputs=((IMAGE, png_bytes(noise_image(6))),))
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("FAILED_PRECONDITION", "task")
    assert MODEL in outcome.error.message and "image2image" in outcome.error.message


def test_the_gemma_tokenizer_round_trips_and_encodes_any_text(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    made = tokenizers.gemma_tokenizer()
    made.save_pretrained(str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "a red fox in the snow, über 9000!"
    ids = loaded(text).input_ids
    assert ids == made(text).input_ids
    assert ids[0] == loaded.bos_token_id == 2 and loaded.pad_token_id == 0
    assert loaded.unk_token_id not in ids, "byte fallback, no unknown tokens"
    assert loaded.decode(ids, skip_special_tokens=True) == text
    assert len(loaded("a red fox").input_ids) == 4, "words of the vocabulary are one token each"
