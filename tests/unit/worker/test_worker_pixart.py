"""PixArt-Sigma text2image through the real legacy_call executor, on `builtin:tiny-pixart-sigma`.

PixArt-Sigma encodes the prompt with T5 and, by default (as the real models), generates at the
nearest bin of its aspect-ratio table and resizes to the requested size: the artifact still has
the size the request asked for.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_worker_tasks import only_result, pixels
from worker_testing import check_image, check_seeded, run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

MODEL = "tiny-pixart-sigma"
DEFAULTS = {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 4.5, "seed": 7}


def run(executor: LegacyCallExecutor, **fields: object) -> list[ItemOutcome]:
    """One text2image job on tiny PixArt-Sigma, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-pixart",
        model=models_pb2.ModelSpec(
            id=MODEL,
            source=f"builtin:{MODEL}",
            pipeline_class="PixArtSigmaPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_TEXT2IMAGE],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_TEXT2IMAGE, model=MODEL, prompt="a red fox", **{**DEFAULTS, **fields}
    )
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


def test_text2image_runs_the_pixart_sigma_pipeline_at_the_requested_size(
    images: dict[str, t.GenerateResult],
) -> None:
    result = images["first"]
    check_image(result.artifacts[0], 64, 64)
    assert result.report.task is t.Task.TEXT2IMAGE
    assert result.report.pipeline_class == "PixArtSigmaPipeline"
    [wide] = images["wide"].artifacts
    assert (wide.width, wide.height) == (96, 64) and pixels(wide).shape == (64, 96, 3)


def test_same_seed_same_bytes_other_seed_other_image(images: dict[str, t.GenerateResult]) -> None:
    check_seeded(images)


def test_two_outputs_have_their_own_seeds(executor: LegacyCallExecutor) -> None:
    result = only_result(run(executor, num_outputs=2))
    assert result.report.seeds == [7, 8]
    first, second = result.artifacts
    assert (first.width, first.height) == (second.width, second.height) == (64, 64)
    assert np.abs(pixels(first) - pixels(second)).mean() > 1
