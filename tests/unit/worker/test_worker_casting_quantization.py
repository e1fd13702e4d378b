"""Load-time weight options on the CPU: layerwise casting (diffusers) and torchao quantization."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from options_testing import failure, pixels, report, run_job

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.model_cache import ModelCache
from omnirt.worker.runtime import backends

CPU = backends.Placement("cpu", "cpu", "float32")
WAN = t.ModelSpec(id="tiny-wan", source="builtin:tiny-wan", pipeline_class="WanPipeline")


@pytest.fixture
def fresh_executor(model_dir: Path) -> LegacyCallExecutor:
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-weights", torch_threads=1))


def test_layerwise_casting_runs_tiny_sd_close_to_float32(fresh_executor: LegacyCallExecutor) -> None:
    plain = run_job(fresh_executor, steps=4)
    other_seed = run_job(fresh_executor, steps=4, seed=12)
    cast = run_job(fresh_executor, steps=4, request_runtime={"layerwise_casting": "float8_e4m3fn"})
    used = report(cast)
    assert used.cold_start  # a load option: its own cache entry
    assert used.config_resolved["runtime_options"] == {
        "layerwise_casting": {"storage_dtype": "float8_e4m3fn", "compute_dtype": "float32"}
    }
    # Tolerance: float8 e4m3 keeps 3 mantissa bits, so each stored weight is off by up to 2^-4
    # (6%) of itself; upcast per layer and computed in float32, 4 steps of the tiny UNet move the
    # pixels by about 1 level on average (measured 0.9, max 7 of 255), while another seed moves
    # them by about 39: the image is the same image.
    diff = np.abs(pixels(cast) - pixels(plain))
    assert diff.mean() < 3 and diff.max() <= 32, (diff.mean(), diff.max())
    assert diff.mean() < 0.1 * np.abs(pixels(other_seed) - pixels(plain)).mean()
    # The UNet's weights are stored in one byte instead of four (norms are kept as they are).
    entries = {bool(k.options): e for k, e in fresh_executor.cache._entries.items()}
    cast_unet = entries[True].pipeline.unet
    assert cast_unet.conv_in.weight.dtype == torch.float8_e4m3fn
    assert entries[True].nbytes < entries[False].nbytes - 2_000_000


def test_layerwise_casting_runs_tiny_wan_close_to_float32(model_dir: Path) -> None:
    cache = ModelCache(model_dir)
    plain = cache.get(WAN, CPU).pipeline
    cast = cache.get(dataclasses.replace(WAN, runtime={"layerwise_casting": "float8_e4m3fn"}), CPU)

    def frames(pipeline: object) -> np.ndarray:
        generator = torch.Generator("cpu").manual_seed(3)
        out = pipeline(  # type: ignore[operator]
            prompt="a fox", width=64, height=64, num_frames=5, num_inference_steps=6, generator=generator
        )
        return np.asarray(out.frames) * 255

    # Tolerance as for tiny-sd: measured mean 0.35, max 5 of 255 (raw frames, before MP4).
    diff = np.abs(frames(cast.pipeline) - frames(plain))
    assert diff.mean() < 3 and diff.max() <= 32, (diff.mean(), diff.max())
    assert cast.pipeline.transformer.blocks[0].ffn.net[0].proj.weight.dtype == torch.float8_e4m3fn


def test_int8_weight_only_quantization_runs_tiny_sd_close_to_float32(
    fresh_executor: LegacyCallExecutor,
) -> None:
    plain = run_job(fresh_executor, steps=4)
    quantized = run_job(fresh_executor, steps=4, request_runtime={"quantization": "int8_weight_only"})
    used = report(quantized)
    assert used.config_resolved["runtime_options"] == {
        "quantization": {"backend": "torchao", "method": "int8_weight_only"}
    }
    # Tolerance: per-channel int8 weights (256 levels, scale from each row's max) are within 0.4%
    # of the row's largest weight; measured 0.03 levels mean, 1 max.
    diff = np.abs(pixels(quantized) - pixels(plain))
    assert diff.mean() < 1 and diff.max() <= 8, (diff.mean(), diff.max())
    entries = {bool(k.options): e for k, e in fresh_executor.cache._entries.items()}
    linear = entries[True].pipeline.unet.down_blocks[1].attentions[0].transformer_blocks[0].attn1.to_q
    assert type(linear.weight).__name__ == "Int8Tensor"  # torchao's int8 weights with scales
    # The model cache counts the real (int8 + scales) bytes: linear layers shrink about 4x.
    assert entries[True].nbytes < entries[False].nbytes - 1_000_000


def test_quantization_the_cpu_cannot_run_is_refused_before_loading(
    fresh_executor: LegacyCallExecutor,
) -> None:
    by_request = failure(run_job(fresh_executor, request_runtime={"quantization": "int4_weight_only"}))
    assert by_request.code == "INVALID_ARGUMENT" and by_request.field == "extra.runtime.quantization"
    assert "no CPU kernels" in by_request.message and "int8_weight_only" in by_request.message
    by_catalog = failure(run_job(fresh_executor, runtime={"quantization": "int4_weight_only"}))
    assert by_catalog.code == "FAILED_PRECONDITION" and by_catalog.field == "runtime.quantization"
    both = failure(
        run_job(
            fresh_executor,
            runtime={"layerwise_casting": "float8_e4m3fn"},
            request_runtime={"quantization": "int8_weight_only"},
        )
    )
    assert both.field == "extra.runtime.quantization" and "layerwise_casting" in both.message
    assert len(fresh_executor.cache) == 0  # nothing was loaded for them
    report(run_job(fresh_executor))  # still serving


def test_layerwise_casting_refuses_lora_adapters(fresh_executor: LegacyCallExecutor, model_dir: Path) -> None:
    from diffusers import StableDiffusionPipeline

    from omnirt.worker.tiny.lora import build_tiny_lora

    build_tiny_lora(StableDiffusionPipeline.from_pretrained(model_dir / "tiny-sd"), model_dir / "cast-lora")
    cast = {"layerwise_casting": "float8_e4m3fn"}
    by_request = failure(run_job(fresh_executor, request_runtime=cast, adapters=["cast-lora"]))
    assert by_request.code == "INVALID_ARGUMENT" and by_request.field == "extra.runtime.layerwise_casting"
    by_catalog = failure(run_job(fresh_executor, runtime=cast, adapters=["cast-lora"]))
    assert by_catalog.code == "INVALID_ARGUMENT" and by_catalog.field == "adapters[0]"
    assert "layerwise casting" in by_catalog.message
    report(run_job(fresh_executor, adapters=["cast-lora"]))  # adapters on the uncast model still work


def test_a_two_expert_model_casts_both_experts(model_dir: Path) -> None:
    """Wan 2.2 A14B's low-noise expert (`transformer_2`) gets the load options too, not only the first."""
    spec = t.ModelSpec(
        id="tiny-wan22",
        source="builtin:tiny-wan22",
        pipeline_class="WanPipeline",
        runtime={"layerwise_casting": "float8_e4m3fn"},
    )
    pipeline = ModelCache(model_dir).get(spec, CPU).pipeline
    for expert in (pipeline.transformer, pipeline.transformer_2):
        assert expert.blocks[0].attn1.to_q.weight.dtype == torch.float8_e4m3fn
