"""The step cache scenario: every kind on a real pipeline, the comparison's floor, the page."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import _scenario as sc
from bench import step_cache


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> sc.Context:
    from bench.suite import quiet_libraries

    quiet_libraries()
    root = tmp_path_factory.mktemp("step_cache")
    return sc.Context(log_dir=root, model_dir=root / "models", torch_threads=1)


@pytest.fixture(scope="module")
def flux(ctx: sc.Context) -> dict[str, Any]:
    # The quick settings on one family, read back from JSON as the page is written.
    settings = replace(step_cache.Settings.quick(), families=("flux",))
    return dict(json.loads(json.dumps(step_cache.run(settings, ctx))))


def test_psnr_is_infinite_for_equal_outputs_and_finite_otherwise() -> None:
    a = np.linspace(0.0, 1.0, 48, dtype=np.float32).reshape(1, 4, 4, 3)
    assert step_cache.psnr(a, a.copy()) == math.inf
    assert step_cache.psnr(np.clip(a + 0.1, 0, 1), a) == pytest.approx(20.0, abs=1.0)


def test_every_kind_runs_on_flux_and_skips_attention(flux: dict[str, Any]) -> None:
    [family] = flux["families"]
    assert (family["pipeline"], family["transformer"], family["blocks"]) == (
        "FluxPipeline",
        "FluxTransformer2DModel",
        10,
    )
    assert family["forwards"] == step_cache.STEPS and family["attentions"] == 10
    assert family["other_seed_psnr_db"] is not None and family["other_seed_psnr_db"] < 30
    kinds = {k["kind"]: k for k in family["kinds"]}
    assert list(kinds) == list(step_cache.KINDS)
    for kind in kinds.values():
        assert kind["status"] == "ok", kind
        # The same seed without a cache: bit for bit the first uncached output (None = inf dB).
        assert kind["repeat_psnr_db"] is None
        # Every kind skips some attention here, so its output moves, but less than another seed's.
        assert 0 < kind["attention_skipped"] < kind["attention_total"] == 100
        assert family["other_seed_psnr_db"] < kind["psnr_db"] < math.inf
        assert kind["cached_p50_ms"] > 0 and kind["uncached_p50_ms"] > 0 and kind["speedup"] > 0
        assert kind["cpu_cached_p50_ms"] > 0 and kind["cpu_uncached_p50_ms"] > 0 and kind["cpu_speedup"] > 0
    # Flux-style blocks: TaylorSeer's full mode; Flux embeds guidance: no branch to skip.
    assert kinds["taylor_seer"]["settings"] == {"kind": "taylor_seer", "use_lite_mode": False}
    assert kinds["faster_cache"]["settings"]["is_guidance_distilled"] is True
    assert kinds["first_block"]["settings"] == {"kind": "first_block", "threshold": 0.42}
    [row] = flux["rows"]
    assert row["scenario"] == "step_cache" and row["case"].startswith("flux (FluxTransformer2DModel")


def test_a_kind_the_denoiser_cannot_take_is_na_with_omnirts_reason(ctx: sc.Context) -> None:
    family = step_cache.FAMILIES["ltx-video"]
    caller = step_cache.Caller(step_cache.load_family(family, ctx), family)
    # OmniRT refuses before calling: LTX-Video has no calibrated magnitude ratios.
    result = step_cache.measure_kind(caller, {"kind": "mag_cache"}, uncached=None, rounds=1)
    assert result["status"] == "n/a"
    assert "mag_cache needs mag_ratios calibrated for LTXVideoTransformer3DModel" in result["reason"]


def test_a_kind_diffusers_cannot_hook_is_na_not_a_crash(ctx: sc.Context) -> None:
    family = step_cache.FAMILIES["skyreels-v2"]
    caller = step_cache.Caller(step_cache.load_family(family, ctx), family)
    # diffusers knows no block metadata for SkyReels-V2's blocks: first_block cannot hook them.
    result = step_cache.measure_kind(
        caller, {"kind": "first_block", "threshold": 0.1}, uncached=None, rounds=1
    )
    assert result["status"] == "n/a"
    assert "SkyReelsV2TransformerBlock'> not registered" in result["reason"]


def test_the_section_renders_every_family_kind_and_setting(flux: dict[str, Any]) -> None:
    text = step_cache.markdown(flux)
    assert step_cache.COMMAND in text
    assert "| flux | `FluxPipeline`: `FluxTransformer2DModel`, 10 blocks, width 192" in text
    assert all(f"`{kind}`" in text for kind in step_cache.KINDS)
    assert "threshold = 0.42" in text and "use_lite_mode = false" in text
    assert "Every uncached call of the run gave the same output as the first: identical." in text


def test_the_suite_knows_the_scenario() -> None:
    from bench import suite

    assert suite.SCENARIOS["step_cache"] is step_cache.SCENARIO
    assert [s.name for s in suite.selected("step_cache")] == ["step_cache"]
    assert not step_cache.SCENARIO.needs_models  # it builds its own tiny models


def test_settings_name_only_known_families() -> None:
    assert set(step_cache.Settings().families) == set(step_cache.FAMILIES)
    assert set(step_cache.Settings.quick().families) <= set(step_cache.FAMILIES)
    with pytest.raises(ValueError, match="unknown families nope"):
        step_cache.run(
            replace(step_cache.Settings(), families=("nope",)), sc.Context(Path("."), Path("."), 1)
        )
