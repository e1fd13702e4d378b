"""Inpaint on the transformer and SDXL families: the family's inpaint pipeline, derived from the
loaded text-to-image one (`from_pipe`, the same weights), keeps the unmasked half and repaints the
masked one (tiny-sdxl, tiny-sd3, tiny-flux; SD 1.x and Qwen-Image have their own tests)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from worker_testing import IMAGE, MASK, Family, noise_image, only_result, pixels, png_bytes, run_family

from omnirt import types as t
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

TASKS = (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT)
SIZE = {"width": 64, "height": 64, "seed": 7}
FAMILIES = [
    (Family("tiny-sdxl", "StableDiffusionXLPipeline", TASKS, {**SIZE, "num_inference_steps": 2}),
     "StableDiffusionXLInpaintPipeline"),
    (Family("tiny-sd3", "StableDiffusion3Pipeline", TASKS, {**SIZE, "num_inference_steps": 4}),
     "StableDiffusion3InpaintPipeline"),
    (Family("tiny-flux", "FluxPipeline", TASKS, {**SIZE, "num_inference_steps": 4}), "FluxInpaintPipeline"),
]  # fmt: skip


def inputs(seed: int = 4) -> tuple[tuple[int, bytes], ...]:
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half
    return ((IMAGE, png_bytes(noise_image(seed))), (MASK, png_bytes(mask)))


@pytest.mark.parametrize(("family", "inpaint_class"), FAMILIES, ids=lambda x: getattr(x, "model", ""))
def test_inpaint_runs_the_familys_inpaint_pipeline_on_the_loaded_weights(
    executor: LegacyCallExecutor, family: Family, inpaint_class: str
) -> None:
    text = only_result(run_family(executor, family, t.Task.TEXT2IMAGE))
    first = only_result(run_family(executor, family, t.Task.INPAINT, inputs=inputs(), strength=1.0))
    again = only_result(run_family(executor, family, t.Task.INPAINT, inputs=inputs(), strength=1.0))
    other = only_result(run_family(executor, family, t.Task.INPAINT, inputs=inputs(seed=5), strength=1.0))
    assert first.report.pipeline_class == inpaint_class
    assert not first.report.cold_start, "the text-to-image model's weights, loaded once"
    [image] = first.artifacts
    assert (image.width, image.height) == (64, 64)
    assert image.sha256 == again.artifacts[0].sha256, "same seed, same bytes"
    assert image.sha256 != other.artifacts[0].sha256, "another input image, another result"
    assert image.sha256 != text.artifacts[0].sha256
    out, source = pixels(image), np.asarray(noise_image(4), dtype=np.float32)
    assert np.abs(out[:, :32] - source[:, :32]).mean() < np.abs(out[:, 32:] - source[:, 32:]).mean()
