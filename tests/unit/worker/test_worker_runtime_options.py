"""Runtime options on tiny-sd: VAE slicing/tiling, torch.compile (and its fallback), CPU offload,
per model (catalog `runtime`) and per request (`extra.runtime`)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from options_testing import failure, report, run_job
from options_testing import pixels as options_pixels
from PIL import Image
from worker_testing import run_assignment

from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor


@pytest.fixture
def options_executor(model_dir: Path) -> LegacyCallExecutor:
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-opts", torch_threads=1))


def run(executor: LegacyCallExecutor, runtime: dict | None = None, job_id: str = "job-1") -> ItemOutcome:
    spec = models_pb2.ModelSpec(
        id="tiny-sd",
        source="builtin:tiny-sd",
        pipeline_class="StableDiffusionPipeline",
        execution_mode="legacy_call",
        tasks=[types_pb2.TASK_TEXT2IMAGE],
    )
    if runtime:
        spec.runtime.update(runtime)
    msg = gateway_pb2.Assignment(assignment_id="as-" + job_id, model=spec)
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_TEXT2IMAGE,
        model="tiny-sd",
        prompt="a fox",
        width=64,
        height=64,
        num_inference_steps=2,
        seed=11,
        num_outputs=2,
    )
    msg.items.add(job_id=job_id, attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def pixels(outcome: ItemOutcome) -> np.ndarray:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return np.asarray(Image.open(io.BytesIO(outcome.result.artifacts[0].data)), dtype=np.float32)


def test_vae_slicing_and_tiling_are_applied_per_call_and_reported(
    options_executor: LegacyCallExecutor,
) -> None:
    plain = run(options_executor)
    sliced = run(options_executor, {"enable_vae_slicing": True, "enable_vae_tiling": True})
    assert np.abs(pixels(sliced) - pixels(plain)).max() <= 2.0
    assert sliced.result is not None and sliced.result.report is not None
    config = sliced.result.report.config_resolved
    assert config["runtime_options"] == {"enable_vae_slicing": True, "enable_vae_tiling": True}
    # Call options: the same pipeline, toggled for the call only (the cached VAE keeps its flags).
    assert len(options_executor.cache) == 1 and not sliced.result.report.cold_start
    [cached] = options_executor.cache._entries.values()
    assert not cached.pipeline.vae.use_slicing and not cached.pipeline.vae.use_tiling
    again = run(options_executor, job_id="job-2")
    assert again.result is not None and "runtime_options" not in again.result.report.config_resolved


def test_cpu_offload_on_cpu_is_ignored_with_a_warning(options_executor: LegacyCallExecutor) -> None:
    outcome = run(options_executor, {"cpu_offload": True})
    pixels(outcome)
    assert outcome.result is not None and outcome.result.report is not None
    assert any("cpu_offload ignored" in w for w in outcome.result.report.warnings)


def test_torch_compile_runs_the_same_images(options_executor: LegacyCallExecutor) -> None:
    plain = run(options_executor)
    compiled = run(options_executor, {"torch_compile": "eager"})  # dynamo without inductor: seconds
    assert np.abs(pixels(compiled) - pixels(plain)).max() <= 1.0
    assert compiled.result is not None and compiled.result.report is not None
    assert compiled.result.report.config_resolved["runtime_options"] == {"torch_compile": "eager"}


def test_a_failing_compile_falls_back_to_eager(
    options_executor: LegacyCallExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_compile(module: torch.nn.Module, *args: object, **kwargs: object) -> None:
        def fail(*a: object, **k: object) -> None:
            raise RuntimeError("no C++ compiler found")

        module._compiled_call_impl = fail  # fails at the first call, like a real compile would

    monkeypatch.setattr(torch.nn.Module, "compile", broken_compile)
    plain = run(options_executor)
    first = run(options_executor, {"torch_compile": True}, job_id="job-2")
    second = run(options_executor, {"torch_compile": True}, job_id="job-3")
    for outcome in (first, second):
        assert np.array_equal(pixels(outcome), pixels(plain))
        assert outcome.result is not None and outcome.result.report is not None
        assert any("torch_compile failed" in w and "C++" in w for w in outcome.result.report.warnings)
        assert "runtime_options" not in outcome.result.report.config_resolved


@pytest.mark.parametrize(
    ("runtime", "name"),
    [
        ({"enable_vae_slicing": "yes"}, "runtime.enable_vae_slicing"),
        ({"torch_compile": "no-such-backend"}, "runtime.torch_compile"),
        ({"cpu_offload": "sometimes"}, "runtime.cpu_offload"),
        ({"devices": [0]}, "runtime.devices"),
    ],
)
def test_bad_options_are_failed_precondition(
    options_executor: LegacyCallExecutor, runtime: dict, name: str
) -> None:
    outcome = run(options_executor, runtime)
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert name in outcome.error.message
    pixels(run(options_executor))  # still serving


# ---- options per request (`extra.runtime`) ----------------------------------------------------


def test_a_request_overrides_the_models_call_options_without_a_reload(
    options_executor: LegacyCallExecutor,
) -> None:
    model = {"enable_vae_slicing": True}
    first = report(run_job(options_executor, runtime=model))
    assert first.config_resolved["runtime_options"] == {"enable_vae_slicing": True}
    off = report(run_job(options_executor, runtime=model, request_runtime={"enable_vae_slicing": False}))
    assert "runtime_options" not in off.config_resolved
    both = report(run_job(options_executor, runtime=model, request_runtime={"enable_vae_tiling": True}))
    assert both.config_resolved["runtime_options"] == {"enable_vae_slicing": True, "enable_vae_tiling": True}
    assert not off.cold_start and not both.cold_start and len(options_executor.cache) == 1


def test_a_request_load_option_is_another_cache_entry(options_executor: LegacyCallExecutor) -> None:
    plain = run_job(options_executor)
    compiled = run_job(options_executor, request_runtime={"torch_compile": "eager"}, job_id="job-2")
    compiled_again = run_job(options_executor, request_runtime={"torch_compile": "eager"}, job_id="job-3")
    assert report(compiled).cold_start and not report(compiled_again).cold_start
    assert report(compiled).config_resolved["runtime_options"] == {"torch_compile": "eager"}
    assert len(options_executor.cache) == 2
    assert not report(run_job(options_executor, job_id="job-4")).cold_start  # the plain one stays warm
    assert np.abs(options_pixels(compiled) - options_pixels(plain)).max() <= 1.0


@pytest.mark.parametrize(
    ("request_runtime", "field"),
    [
        ({"vae_tiling": True}, "extra.runtime.vae_tiling"),
        ({"enable_vae_tiling": 1}, "extra.runtime.enable_vae_tiling"),
        ({"torch_compile": "no-such-backend"}, "extra.runtime.torch_compile"),
        ({"step_cache": {"kind": "first_block", "threshold": -1}}, "extra.runtime.step_cache.threshold"),
        (["enable_vae_tiling"], "extra.runtime"),
    ],
)
def test_bad_request_options_are_invalid_argument(
    options_executor: LegacyCallExecutor, request_runtime: object, field: str
) -> None:
    error = failure(run_job(options_executor, request_runtime=request_runtime))
    assert error.code == "INVALID_ARGUMENT" and error.field == field, error
    assert field in error.message
    report(run_job(options_executor))  # still serving
