"""Pipeline calls run under torch.inference_mode, except for pipelines that take gradients
(diffusers' attend-and-excite, here over tiny-sd's weights); `runtime.inference_mode` overrides."""

from __future__ import annotations

import importlib
import inspect
import linecache
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import diffusers
import numpy as np
import pytest
import torch
from options_testing import pixels, report, run_job

from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.runtime.inference_mode import takes_gradients

ATTEND_AND_EXCITE = "StableDiffusionAttendAndExcitePipeline"
# Attend-and-excite needs the token positions to strengthen, and attention maps of tiny-sd's
# size (its cross-attention runs on 4x4 latents at 64x64).
EXCITE_EXTRA = {"token_indices": [2, 5], "attn_res": [4, 4], "max_iter_to_alter": 2}


@pytest.fixture
def grad_executor(model_dir: Path) -> LegacyCallExecutor:
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-grad", torch_threads=1))


def run(
    executor: LegacyCallExecutor,
    pipeline_class: str = "",
    *,
    runtime: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    job_id: str = "job-1",
) -> ItemOutcome:
    return run_job(
        executor,
        pipeline_class=pipeline_class,
        runtime=runtime,
        extra=extra,
        job_id=job_id,
        prompt="a cat and a dog",
        seed=5,
    )


def record_unet_modes(executor: LegacyCallExecutor, pipeline_class: str) -> list[bool]:
    """Whether each forward of the cached `pipeline_class` pipeline's UNet ran in inference mode."""
    [cached] = [e for e in executor.cache._entries.values() if type(e.pipeline).__name__ == pipeline_class]
    modes: list[bool] = []
    cached.pipeline.unet.register_forward_pre_hook(
        lambda module, args: modes.append(torch.is_inference_mode_enabled())
    )
    return modes


def test_only_the_pipelines_that_take_gradients_are_detected() -> None:
    assert takes_gradients(getattr(diffusers, ATTEND_AND_EXCITE))
    assert takes_gradients(diffusers.StableDiffusionPix2PixZeroPipeline)
    assert not takes_gradients(diffusers.StableDiffusionPipeline)
    assert not takes_gradients(diffusers.StableDiffusionImg2ImgPipeline)
    assert not takes_gradients(diffusers.WanPipeline)


def test_a_custom_pipelines_own_code_is_read_at_once_by_many_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user's pipeline module, detected by reading its file (not inspect's line cache, which
    tracebacks share and which is not thread-safe), by the slots' first calls all at once."""
    base = "import diffusers\nimport torch\n\n\nclass {name}(diffusers.StableDiffusionPipeline):\n"
    (tmp_path / "guided_pipe.py").write_text(
        base.format(name="GuidedPipeline") + "    def guide(self, x):\n        with torch.enable_grad():\n"
        "            return x.requires_grad_()\n"
    )
    (tmp_path / "plain_pipe.py").write_text(base.format(name="PlainPipeline") + "    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    guided = importlib.import_module("guided_pipe").GuidedPipeline
    plain = importlib.import_module("plain_pipe").PlainPipeline

    def unusable(*args: object, **kwargs: object) -> None:
        raise AssertionError("the line cache is not used")

    monkeypatch.setattr(linecache, "getlines", unusable)
    monkeypatch.setattr(inspect, "getsource", unusable)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(takes_gradients, [guided, plain] * 8))
    assert answers == [True, False] * 8


def test_a_plain_pipeline_runs_in_inference_mode_with_the_same_pixels(
    grad_executor: LegacyCallExecutor,
) -> None:
    first = run(grad_executor)
    modes = record_unet_modes(grad_executor, "StableDiffusionPipeline")
    second = run(grad_executor, job_id="job-2")
    assert modes and all(modes)
    assert "runtime_options" not in report(second).config_resolved  # the default is not reported
    # Off (the request's option): the pipeline's own no_grad, and not one pixel differs.
    modes.clear()
    off = run(grad_executor, runtime={"inference_mode": False}, job_id="job-3")
    assert modes and not any(modes)
    assert report(off).config_resolved["runtime_options"] == {"inference_mode": False}
    assert np.array_equal(pixels(off), pixels(second)) and np.array_equal(pixels(first), pixels(second))


def test_a_pipeline_that_takes_gradients_runs_outside_inference_mode(
    grad_executor: LegacyCallExecutor,
) -> None:
    excited = run(grad_executor, ATTEND_AND_EXCITE, extra=EXCITE_EXTRA)
    assert report(excited).config_resolved["runtime_options"] == {"inference_mode": False}
    assert pixels(excited).shape == (64, 64, 3)
    modes = record_unet_modes(grad_executor, ATTEND_AND_EXCITE)
    again = run(grad_executor, ATTEND_AND_EXCITE, extra=EXCITE_EXTRA, job_id="job-2")
    assert modes and not any(modes)
    assert np.array_equal(pixels(again), pixels(excited))
    # Forced on, its gradient step has nothing to work with: the call fails (that is why it is off).
    forced = run(
        grad_executor, ATTEND_AND_EXCITE, runtime={"inference_mode": True}, extra=EXCITE_EXTRA, job_id="job-3"
    )
    assert forced.error is not None
