"""Step caching (diffusers cache hooks) per call on tiny-wan, and its refusal on tiny-sd's UNet."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import diffusers
import numpy as np
import pytest
from options_testing import failure, pixels, report, run_job

from omnirt._internal import runtime_schema
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.runtime import step_cache

# 8 steps with classifier-free guidance: 16 denoiser forwards of 4 attention modules each.
WAN = {"steps": 8, "guidance_scale": 5.0}
FIRST_BLOCK = {"kind": "first_block", "threshold": 0.2}


@pytest.fixture(scope="module")
def wan_executor(model_dir: Path) -> LegacyCallExecutor:
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-cache", torch_threads=1))


def test_the_schema_names_fields_of_the_installed_diffusers_configs() -> None:
    assert set(step_cache.CONFIG_CLASSES) == set(runtime_schema.STEP_CACHE_KINDS)
    for kind, fields in runtime_schema.STEP_CACHE_KINDS.items():
        config = getattr(diffusers, step_cache.CONFIG_CLASSES[kind])
        assert set(fields) <= {f.name for f in dataclasses.fields(config)}, kind


# MagCache's ratios are calibrated per checkpoint; these are a plausible made-up curve (the tiny
# model has none: diffusers ships only Flux's), enough to make it skip steps after the first two.
MAG_CACHE = {
    "kind": "mag_cache",
    "threshold": 0.5,
    "retention_ratio": 0.2,
    "mag_ratios": [1.0, 0.99, 0.98, 0.97],
}


@pytest.mark.parametrize(
    "settings",
    [
        FIRST_BLOCK,
        "pyramid_attention_broadcast",
        MAG_CACHE,
        {"kind": "taylor_seer", "cache_interval": 2, "use_lite_mode": True},
    ],
    ids=["first_block", "pab", "mag_cache", "taylor_seer"],
)
def test_a_step_cache_reuses_work_for_one_call_and_is_reported(
    wan_executor: LegacyCallExecutor, settings: object
) -> None:
    plain = run_job(wan_executor, "tiny-wan", **WAN)
    other_seed = run_job(wan_executor, "tiny-wan", seed=12, **WAN)
    cached = run_job(wan_executor, "tiny-wan", request_runtime={"step_cache": settings}, **WAN)
    after = run_job(wan_executor, "tiny-wan", **WAN)

    used = report(cached)
    kind = settings["kind"] if isinstance(settings, dict) else settings
    assert used.config_resolved["runtime_options"]["step_cache"]["kind"] == kind
    # Attention computations served from the cache: some of the 64, never all.
    assert 0 < used.cache_hits["step_cache"] < 64
    assert not used.cold_start  # a call option: the loaded pipeline, not another one
    # Tolerance: reusing a block's (or an attention's) output from an earlier step changes the
    # latents a little, so the video differs from the uncached one, but it stays far closer to
    # it than a video of another seed (mean pixel distance; MP4 encoding adds noise of its own).
    seed_distance = np.abs(pixels(other_seed) - pixels(plain)).mean()
    cache_distance = np.abs(pixels(cached) - pixels(plain)).mean()
    assert cache_distance < 0.5 * seed_distance, (cache_distance, seed_distance)
    # The hooks are gone after the call: the next plain call computes everything again.
    assert report(after).cache_hits == {} and "runtime_options" not in report(after).config_resolved
    # ... to the same bytes as before the cached call (same seed, same frames, same MP4).
    assert after.result is not None and plain.result is not None
    assert after.result.artifacts[0].sha256 == plain.result.artifacts[0].sha256
    [entry] = wan_executor.cache._entries.values()
    assert not entry.pipeline.transformer.is_cache_enabled


def test_a_step_cache_that_does_not_suit_the_model_fails_the_job_clearly(
    wan_executor: LegacyCallExecutor,
) -> None:
    # FasterCache expects the conditional and unconditional passes in one batch; Wan runs them apart.
    error = failure(run_job(wan_executor, "tiny-wan", request_runtime={"step_cache": "faster_cache"}, **WAN))
    assert error.code == "INVALID_ARGUMENT" and error.field == "extra.runtime.step_cache"
    assert "faster_cache" in error.message and "WanTransformer3DModel" in error.message
    assert report(run_job(wan_executor, "tiny-wan", **WAN)).cache_hits == {}  # still serving, hooks gone


def test_a_unet_denoiser_is_refused(executor: LegacyCallExecutor) -> None:
    by_request = failure(run_job(executor, request_runtime={"step_cache": FIRST_BLOCK}))
    assert by_request.code == "INVALID_ARGUMENT" and by_request.field == "extra.runtime.step_cache"
    assert "UNet2DConditionModel" in by_request.message and "cache hooks" in by_request.message
    by_catalog = failure(run_job(executor, runtime={"step_cache": FIRST_BLOCK}))
    assert by_catalog.code == "FAILED_PRECONDITION" and by_catalog.field == "runtime.step_cache"
    report(run_job(executor))  # still serving


def test_mag_cache_without_ratios_for_a_model_diffusers_has_none_for_is_refused(
    wan_executor: LegacyCallExecutor,
) -> None:
    error = failure(run_job(wan_executor, "tiny-wan", request_runtime={"step_cache": "mag_cache"}, **WAN))
    assert error.code == "INVALID_ARGUMENT" and error.field == "extra.runtime.step_cache"
    assert "mag_ratios calibrated for WanTransformer3DModel" in error.message


def test_taylor_seer_whose_patterns_miss_the_model_is_refused_not_silently_off(
    wan_executor: LegacyCallExecutor,
) -> None:
    """Its default attention patterns fit Flux's block names, not Wan's (`blocks.0.attn1`)."""
    error = failure(run_job(wan_executor, "tiny-wan", request_runtime={"step_cache": "taylor_seer"}, **WAN))
    assert error.code == "INVALID_ARGUMENT" and error.field == "extra.runtime.step_cache"
    assert "use_lite_mode" in error.message


def test_mag_cache_on_flux_uses_the_ratios_diffusers_ships_and_skips_steps(
    wan_executor: LegacyCallExecutor,
) -> None:
    flux = {"pipeline_class": "FluxPipeline", "steps": 12, "guidance_scale": 3.5}
    plain = run_job(wan_executor, "tiny-flux", **flux)
    cached = run_job(wan_executor, "tiny-flux", request_runtime={"step_cache": "mag_cache"}, **flux)
    used = report(cached)
    assert used.config_resolved["runtime_options"]["step_cache"] == {"kind": "mag_cache"}
    assert used.cache_hits["step_cache"] > 0, "FLUX_MAG_RATIOS interpolated to 12 steps skip some"
    assert report(plain).cache_hits == {}


def test_a_cache_diffusers_cannot_hook_fails_the_job_naming_it_and_leaves_no_hook(
    wan_executor: LegacyCallExecutor,
) -> None:
    """diffusers raises while hooking SkyReels-V2's blocks for first_block (a block class its hooks
    do not know): the job fails naming the option, and the shared pipeline keeps no hook."""
    skyreels = {"pipeline_class": "SkyReelsV2Pipeline", "steps": 2, "guidance_scale": 5.0}
    error = failure(
        run_job(wan_executor, "tiny-skyreels-v2", request_runtime={"step_cache": FIRST_BLOCK}, **skyreels)
    )
    assert error.code == "INVALID_ARGUMENT" and error.field == "extra.runtime.step_cache"
    assert "first_block" in error.message
    entry = next(
        e for e in wan_executor.cache._entries.values() if "skyreels" in type(e.pipeline).__name__.lower()
    )
    transformer = entry.pipeline.transformer
    assert transformer._cache_config is None and not transformer.is_cache_enabled
    assert not any(m._forward_pre_hooks for m in transformer.modules()), "the counting hooks are removed"
    plain = run_job(wan_executor, "tiny-skyreels-v2", **skyreels)
    assert plain.error is None and report(plain).cache_hits == {}
