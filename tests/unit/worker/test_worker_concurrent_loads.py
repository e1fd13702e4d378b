"""Two models loading at once in one worker: each must come out whole, and a failed load is retried.

diffusers' `low_cpu_mem_usage` path (accelerate's `init_empty_weights`) patches torch
process-wide while a model is built; a second thread building modules meanwhile got meta
tensors ("Cannot copy out of meta tensor") and the broken model stayed cached.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from omnirt import types as t
from omnirt.worker import adapters, backends
from omnirt.worker.model_cache import ModelCache, ModelLoadError
from omnirt.worker.tiny_lora import build_tiny_lora
from omnirt.worker.tiny_models import ensure_builtin

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


def test_two_models_loaded_from_two_threads_at_once_are_complete(both_built: Path) -> None:
    alone = {}
    for spec in (SD, WAN):
        cache = ModelCache(both_built)
        alone[spec.id] = shape(cache.get(spec, CPU).pipeline)
    assert all(meta == 0 for s in alone.values() for _, meta in s.values())

    for repetition in range(REPETITIONS):
        for model, got in load_at_once(ModelCache(both_built), [SD, WAN]).items():
            assert got == alone[model], f"repetition {repetition}: {model} loaded as {got}"


def test_an_adapter_loaded_while_another_model_loads_is_complete(both_built: Path) -> None:
    wan_alone = shape(ModelCache(both_built).get(WAN, CPU).pipeline)
    lora = build_tiny_lora(ModelCache(both_built).get(SD, CPU).pipeline, both_built / "loras" / "concurrent")
    adapter = adapters.ResolvedAdapter("loras/concurrent", lora, 1.0, 0)
    for repetition in range(REPETITIONS):
        sd = ModelCache(both_built).get(SD, CPU).pipeline
        barrier = threading.Barrier(2)
        got: dict[str, Any] = {}

        def load_adapter(sd: Any = sd, barrier: threading.Barrier = barrier, got: dict = got) -> None:
            barrier.wait()
            with adapters.applied(sd, [adapter], {}):
                got["sd"] = shape(sd)

        thread = threading.Thread(target=load_adapter)
        thread.start()
        barrier.wait()
        wan = shape(ModelCache(both_built).get(WAN, CPU).pipeline)
        thread.join()
        assert wan == wan_alone, f"repetition {repetition}: tiny-wan loaded as {wan}"
        assert all(meta == 0 for _, meta in got["sd"].values()), f"repetition {repetition}: {got['sd']}"


def load_at_once(cache: ModelCache, specs: list[t.ModelSpec]) -> dict[str, Any]:
    """Each spec loaded by its own thread, all starting together: model id -> `shape` or exception."""
    barrier = threading.Barrier(len(specs))
    loaded: dict[str, Any] = {}

    def load(spec: t.ModelSpec) -> None:
        barrier.wait()
        try:
            loaded[spec.id] = shape(cache.get(spec, CPU).pipeline)
        except Exception as exc:  # the test reports it
            loaded[spec.id] = exc

    threads = [threading.Thread(target=load, args=(spec,)) for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return loaded


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
