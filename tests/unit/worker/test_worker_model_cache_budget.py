"""The model cache's memory budget: LRU eviction of idle pipelines and of loaded LoRA adapters,
warm/cold reports, refusals."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from options_testing import run_job
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.model_cache import ModelCache, ModelTooLargeError
from omnirt.worker.runtime import backends
from omnirt.worker.runtime.adapters import loaded_adapters
from omnirt.worker.tiny.lora import build_tiny_lora
from omnirt.worker.tiny.registry import ensure_builtin

CPU = backends.Placement("cpu", "cpu", "float32")
SD = t.ModelSpec(id="tiny-sd", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline")
WAN = t.ModelSpec(id="tiny-wan", source="builtin:tiny-wan", pipeline_class="WanPipeline")
# tiny-sd holds about 4.4 MB of float32 parameters and buffers, tiny-wan about 0.44 MB:
# this budget fits either one, not both.
ONE_MODEL_BUDGET = 4_600_000


def run_model(executor: LegacyCallExecutor, model: str) -> ItemOutcome:
    """One small request for builtin `model` (tiny-sd: text2image; tiny-wan: text2video)."""
    video = model == "tiny-wan"
    task = types_pb2.TASK_TEXT2VIDEO if video else types_pb2.TASK_TEXT2IMAGE
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-{model}",
        model=models_pb2.ModelSpec(
            id=model,
            source=f"builtin:{model}",
            pipeline_class="WanPipeline" if video else "StableDiffusionPipeline",
            execution_mode="legacy_call",
            tasks=[task],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=task, model=model, prompt="a fox", width=64, height=64, num_inference_steps=2, seed=3
    )
    if video:
        request.num_frames = 5
    msg.items.add(job_id=f"job-{model}", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def report(outcome: ItemOutcome) -> t.RunReport:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None and outcome.result.report is not None
    return outcome.result.report


def test_alternating_models_over_a_one_model_budget_evict_and_reload(model_dir: Path) -> None:
    executor = LegacyCallExecutor(
        WorkerConfig(model_dir=str(model_dir), worker_id="w-budget", model_cache_bytes=ONE_MODEL_BUDGET)
    )
    first = report(run_model(executor, "tiny-sd"))
    assert first.cold_start and not first.warnings
    assert executor.loaded_models() == ["tiny-sd"]
    again = report(run_model(executor, "tiny-sd"))
    assert not again.cold_start  # warm: the budget does not evict what fits

    wan = report(run_model(executor, "tiny-wan"))
    assert wan.cold_start
    assert any("evicted" in w and "tiny-sd" in w for w in wan.warnings), wan.warnings
    assert executor.loaded_models() == ["tiny-wan"]

    sd = report(run_model(executor, "tiny-sd"))
    assert sd.cold_start
    assert any("evicted" in w and "tiny-wan" in w for w in sd.warnings), sd.warnings
    assert executor.loaded_models() == ["tiny-sd"]
    assert executor.cache.held_bytes() <= ONE_MODEL_BUDGET


def test_a_model_bigger_than_the_budget_is_failed_precondition(model_dir: Path) -> None:
    executor = LegacyCallExecutor(
        WorkerConfig(model_dir=str(model_dir), worker_id="w-small", model_cache_bytes=1_000_000)
    )
    outcome = run_model(executor, "tiny-sd")
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "tiny-sd" in outcome.error.message and "1000000 bytes" in outcome.error.message
    assert executor.loaded_models() == []
    # The worker keeps serving what fits.
    assert report(run_model(executor, "tiny-wan")).cold_start


def test_a_pipeline_in_use_is_never_evicted(model_dir: Path) -> None:
    cache = ModelCache(model_dir, budget_bytes=ONE_MODEL_BUDGET)
    sd = cache.get(SD, CPU)  # held: not released
    wan = cache.get(WAN, CPU)
    assert wan.evicted == () and any("over budget" in w for w in wan.warnings)
    assert cache.loaded_models() == ["tiny-sd", "tiny-wan"]
    cache.release(wan)
    cache.release(sd)
    assert not cache.get(SD, CPU).cold  # released entries stay warm until room is needed


def test_a_model_over_budget_is_refused_and_not_kept(model_dir: Path) -> None:
    small = ModelCache(model_dir, budget_bytes=100)
    for _ in range(2):  # measured at the first load, refused before loading at the second
        with pytest.raises(ModelTooLargeError, match=r"'tiny-sd'.*budget of 0\.0 MB \(100 bytes\)"):
            small.get(SD, CPU)
    assert len(small) == 0


def test_negative_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="model_cache_bytes"):
        WorkerConfig(model_cache_bytes=-1)


# ---- loaded LoRA adapters count against the budget --------------------------------------------


@dataclass(frozen=True)
class Sizes:
    sd: int
    wan: int
    adapter: int


@pytest.fixture(scope="module")
def loras(model_dir: Path) -> list[str]:
    """Two tiny LoRAs for tiny-sd in the worker's model dir (an allowed adapter folder)."""
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(ensure_builtin("tiny-sd", model_dir))
    for seed in (1, 2):
        build_tiny_lora(pipeline, model_dir / "budget-loras" / f"lora{seed}", seed=seed)
    return ["budget-loras/lora1", "budget-loras/lora2"]


@pytest.fixture(scope="module")
def sizes(model_dir: Path, loras: list[str]) -> Sizes:
    """What tiny-sd, tiny-wan and one tiny LoRA take in memory, measured without a budget."""
    executor = LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-sizes"))
    report(run_model(executor, "tiny-sd"))
    sd = executor.cache.held_bytes()
    with_adapter = report(run_job(executor, adapters=loras[:1]))
    [adapter] = with_adapter.config_resolved["adapters"]
    assert adapter["bytes"] == executor.cache.held_bytes() - sd > 0
    report(run_model(executor, "tiny-wan"))
    return Sizes(sd=sd, wan=executor.cache.held_bytes() - sd - adapter["bytes"], adapter=adapter["bytes"])


def budget_executor(model_dir: Path, budget: int) -> LegacyCallExecutor:
    return LegacyCallExecutor(
        WorkerConfig(model_dir=str(model_dir), worker_id="w-adapters", model_cache_bytes=budget)
    )


def test_adapters_are_measured_and_reported_with_the_cache_holding(
    model_dir: Path, loras: list[str], sizes: Sizes
) -> None:
    executor = budget_executor(model_dir, 10 * sizes.sd)
    used = report(run_job(executor, adapters=loras[:1]))
    assert used.config_resolved["adapters"][0]["bytes"] == sizes.adapter
    assert used.config_resolved["model_cache"] == {
        "held_bytes": sizes.sd + sizes.adapter,
        "budget_bytes": 10 * sizes.sd,
    }
    assert executor.cache.held_bytes() == sizes.sd + sizes.adapter


def test_a_new_adapter_unloads_the_least_recently_used_one_to_fit(
    model_dir: Path, loras: list[str], sizes: Sizes
) -> None:
    budget = sizes.sd + sizes.adapter * 3 // 2  # the model and one adapter
    executor = budget_executor(model_dir, budget)
    first = run_job(executor, adapters=loras[:1])
    second = report(run_job(executor, adapters=loras[1:]))
    assert any("unloaded adapter(s)" in w and "lora1" in w for w in second.warnings), second.warnings
    assert executor.cache.held_bytes() <= budget
    [entry] = executor.cache._entries.values()
    assert [Path(p).name for p in loaded_adapters(entry.pipeline)] == ["lora2"]
    again = run_job(executor, adapters=loras[:1])  # reloaded: same weights, same image
    assert any("lora2" in w for w in report(again).warnings)
    assert again.result is not None and first.result is not None
    assert again.result.artifacts[0].data == first.result.artifacts[0].data


def test_an_adapter_evicts_an_idle_model_when_no_adapter_can_go(
    model_dir: Path, loras: list[str], sizes: Sizes
) -> None:
    budget = sizes.sd + sizes.wan + sizes.adapter // 2  # both models, but no adapter beside them
    executor = budget_executor(model_dir, budget)
    # The first load of a model estimates its size from its files (a little more than it takes
    # in memory); once measured, both fit.
    for model in ("tiny-wan", "tiny-sd", "tiny-wan"):
        report(run_model(executor, model))
    assert executor.loaded_models() == ["tiny-sd", "tiny-wan"]
    used = report(run_job(executor, adapters=loras[:1]))
    assert any("evicted model(s) tiny-wan" in w and "lora1" in w for w in used.warnings), used.warnings
    assert executor.loaded_models() == ["tiny-sd"]
    assert executor.cache.held_bytes() == sizes.sd + sizes.adapter <= budget


def test_an_adapter_that_cannot_fit_beside_its_model_is_failed_precondition(
    model_dir: Path, loras: list[str], sizes: Sizes
) -> None:
    executor = budget_executor(model_dir, sizes.sd + sizes.adapter // 2)
    error = run_job(executor, adapters=loras[:1]).error
    assert error is not None and error.code == "FAILED_PRECONDITION" and error.field == "adapters[0]"
    assert "model cache budget" in error.message
    assert executor.cache.held_bytes() == sizes.sd  # nothing loaded, the worker keeps serving
    report(run_model(executor, "tiny-sd"))
