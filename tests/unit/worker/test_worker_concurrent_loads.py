"""Two models loading at once in one worker: each must come out whole, and a failed load is retried.

diffusers' `low_cpu_mem_usage` path (accelerate's `init_empty_weights`) patches torch
process-wide while a model is built; a second thread building modules meanwhile got meta
tensors ("Cannot copy out of meta tensor") and the broken model stayed cached.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from options_testing import report, run_job

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.model_cache import ModelCache, ModelLoadError
from omnirt.worker.runtime import adapters, backends
from omnirt.worker.tiny.lora import build_tiny_lora
from omnirt.worker.tiny.registry import ensure_builtin

CPU = backends.Placement("cpu", "cpu", "float32")
SD = t.ModelSpec(id="tiny-sd", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline")
WAN = t.ModelSpec(id="tiny-wan", source="builtin:tiny-wan", pipeline_class="WanPipeline")
REPETITIONS = 6


def shape(pipeline: Any) -> dict[str, tuple[int, int]]:
    """Per nn.Module component: (parameter + buffer elements, meta tensors)."""
    result = {}
    for name, component in pipeline.components.items():
        if isinstance(component, torch.nn.Module):
            tensors = [*component.parameters(), *component.buffers()]
            meta = sum(1 for x in tensors if x.device.type == "meta")
            result[name] = (sum(x.numel() for x in tensors), meta)
    return result


@pytest.fixture(scope="module")
def both_built(model_dir: Path) -> Path:
    ensure_builtin("tiny-wan", model_dir)
    return model_dir


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run each call in its own thread, all starting together; their results (or exceptions)."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except Exception as exc:  # the test reports it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_two_models_loaded_from_two_threads_at_once_are_complete(both_built: Path) -> None:
    alone = [shape(ModelCache(both_built).get(spec, CPU).pipeline) for spec in (SD, WAN)]
    assert all(meta == 0 for s in alone for _, meta in s.values())
    for repetition in range(REPETITIONS):
        cache = ModelCache(both_built)
        loaded = at_once(*(functools.partial(loaded_shape, cache, spec) for spec in (SD, WAN)))
        assert loaded == alone, f"repetition {repetition}: loaded as {loaded}"


def loaded_shape(cache: ModelCache, spec: t.ModelSpec) -> dict[str, tuple[int, int]]:
    return shape(cache.get(spec, CPU).pipeline)


def test_an_adapter_loaded_while_another_model_loads_is_complete(both_built: Path) -> None:
    wan_alone = shape(ModelCache(both_built).get(WAN, CPU).pipeline)
    lora = build_tiny_lora(ModelCache(both_built).get(SD, CPU).pipeline, both_built / "loras" / "concurrent")
    adapter = adapters.ResolvedAdapter("loras/concurrent", lora, 1.0, 0)

    def with_adapter(sd: Any) -> dict[str, tuple[int, int]]:
        with adapters.applied(sd, [adapter], {}):
            return shape(sd)

    for repetition in range(REPETITIONS):
        sd = ModelCache(both_built).get(SD, CPU).pipeline
        sd_shape, wan = at_once(
            functools.partial(with_adapter, sd), lambda: shape(ModelCache(both_built).get(WAN, CPU).pipeline)
        )
        assert wan == wan_alone, f"repetition {repetition}: tiny-wan loaded as {wan}"
        assert all(meta == 0 for _, meta in sd_shape.values()), f"repetition {repetition}: {sd_shape}"


def test_first_jobs_of_two_models_at_once_both_succeed(both_built: Path) -> None:
    """`--slots 2` with tiny-sd's and tiny-wan's first jobs at once (3 of 4 tries failed before)."""
    for repetition in range(3):
        config = WorkerConfig(model_dir=str(both_built), worker_id="w-two", torch_threads=1, slots=2)
        executor = LegacyCallExecutor(config)
        outcomes = at_once(
            *(functools.partial(run_job, executor, m, job_id=m) for m in ("tiny-sd", "tiny-wan"))
        )
        for outcome in outcomes:
            assert outcome.error is None, f"repetition {repetition}: {outcome}"
            assert report(outcome).cold_start


def test_a_failed_load_is_not_cached_and_the_next_call_loads_again(
    both_built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import StableDiffusionPipeline

    cache = ModelCache(both_built)
    real = StableDiffusionPipeline.from_pretrained
    calls = []

    def first_broken(cls: type, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        pipeline = real(*args, **kwargs)
        if len(calls) == 1:  # what a concurrent load did: a component left on the meta device
            pipeline.unet.to_empty(device="meta")
        return pipeline

    monkeypatch.setattr(StableDiffusionPipeline, "from_pretrained", classmethod(first_broken))
    with pytest.raises(ModelLoadError, match="meta device") as failure:
        cache.get(SD, CPU)
    assert "unet" in str(failure.value)
    assert len(cache) == 0 and cache.loaded_models() == []
    second = cache.get(SD, CPU)
    assert second.cold and len(calls) == 2
    assert all(meta == 0 for _, meta in shape(second.pipeline).values())
