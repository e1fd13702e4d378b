"""Loading one pipeline from its source: the step of `ModelCache.get` that builds the modules.

Every source goes through the same loading code: `builtin:NAME` is first built into
`model_dir/NAME` (`tiny_models.resolve_source`) and then loaded from that path like any local
model or hub id with `from_pretrained`. A transformers TTS model (`pipeline_class =
"VitsModel"`) is loaded by `omnirt.worker.pipelines.speech` instead, under the same lock, into
a pipeline-like wrapper. Modules a loaded model already holds (byte-identical files, class and
load context) are passed in rather than built again (`shared_components`). A load whose
modules come out with tensors on the meta device fails (ModelLoadError).

What a load is (`CacheKey`: source, pipeline class, device, dtype, device map, load-time
runtime options) is defined here too: the model cache keeps one pipeline per key.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnirt import types as t
from omnirt.worker.pipelines.shared_components import SharedComponents, SharePlan
from omnirt.worker.redact import redact_paths
from omnirt.worker.runtime import backends, quantization
from omnirt.worker.runtime import options as runtime_options
from omnirt.worker.runtime.backends import Placement
from omnirt.worker.tiny import registry as tiny_models

log = logging.getLogger(__name__)

DEFAULT_PIPELINE_CLASS = "DiffusionPipeline"

# Building torch modules is not thread-safe while a model loads: diffusers' `low_cpu_mem_usage`
# path (accelerate's `init_empty_weights`) replaces `torch.nn.Module.register_parameter` for the
# whole process, and `no_init_weights` the `torch.nn.init` functions, for as long as a model is
# built. A second thread building modules meanwhile (another model's load, a LoRA adapter's
# layers, a builtin model's builder) got meta tensors ("Cannot copy out of meta tensor", models
# smaller than they should be), and two overlapping patches can restore each other's wrapper, which
# leaves the process patched for good. So every module build of this process holds this one lock:
# loads of different models run one after another. The cost: cold loads no longer overlap, two
# at once take the sum of their times (tiny-sd 66 ms + tiny-wan 40 ms alone; both from two
# threads at once 109 ms, where a perfect overlap on 2 cores could at best have been 66 ms; a hub
# id's first download runs under it too). Pipeline calls never take it.
LOAD_LOCK = threading.Lock()


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the model, its source and the reason."""

    def __init__(self, model_id: str, source: str, reason: str) -> None:
        super().__init__(f"cannot load model {model_id!r} from {source!r}: {reason}")
        self.model_id = model_id
        self.source = source
        self.reason = reason


@dataclass(frozen=True)
class CacheKey:
    """What makes two loads the same."""

    source: str
    pipeline_class: str
    device: str
    dtype: str
    device_map: str = ""
    # Load-time runtime options (`runtime_options.LoadOptions.key()`).
    options: str = ""


def cache_key(spec: t.ModelSpec, placement: Placement) -> CacheKey:
    """The cache key of `spec` placed on `placement`."""
    return CacheKey(
        source=spec.source or spec.id,
        pipeline_class=spec.pipeline_class or DEFAULT_PIPELINE_CLASS,
        device=placement.device,
        dtype=placement.dtype,
        device_map=placement.device_map,
        options=_options_key(spec),
    )


def _options_key(spec: t.ModelSpec) -> str:
    try:
        return runtime_options.load_options(spec.runtime).key()
    except backends.BackendError:
        return "invalid"  # refused again, with the reason, by the load


def dtype_argument() -> str:
    """`dtype` on diffusers that renamed it (0.42+, where `torch_dtype` warns), else `torch_dtype`."""
    try:
        from diffusers.utils import deprecation_utils
    except ImportError:
        return "torch_dtype"
    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


def meta_components(pipeline: Any) -> list[str]:
    """Names of `pipeline`'s torch modules with a parameter or buffer on the meta device (no data)."""
    import torch

    return [
        name
        for name, component in getattr(pipeline, "components", {}).items()
        if isinstance(component, torch.nn.Module)
        and any(x.device.type == "meta" for x in (*component.parameters(), *component.buffers()))
    ]


def _short_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 600 else text[:597] + "..."


class PipelineLoader:
    """Loads pipelines for one model dir, sharing modules with the pipelines it loaded before."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.shared = SharedComponents()

    def load(self, spec: t.ModelSpec, key: CacheKey, placement: Placement) -> tuple[Any, SharePlan]:
        """`spec`'s pipeline loaded as `key` on `placement`, and what it took from loaded models.

        Raises ModelLoadError (the reason without the worker's folders).
        """
        location = key.source
        try:
            import diffusers
            from diffusers.utils import logging as diffusers_logging

            from omnirt.worker.pipelines import qwen_vl_processor, speech

            diffusers_logging.disable_progress_bar()
            if speech.is_speech_class(key.pipeline_class):  # a transformers TTS model (VITS)
                with LOAD_LOCK:
                    location = tiny_models.resolve_source(key.source, self.model_dir)
                    options = runtime_options.load_options(spec.runtime)
                    return speech.load(location, key.pipeline_class, placement, options), SharePlan()
            with LOAD_LOCK:  # diffusers imports its classes lazily, and not thread-safely
                cls = getattr(diffusers, key.pipeline_class, None)
            if not isinstance(cls, type) or not issubclass(cls, diffusers.DiffusionPipeline):
                raise ModelLoadError(spec.id, key.source, f"unknown pipeline class {key.pipeline_class!r}")
            kwargs: dict[str, Any] = {dtype_argument(): placement.torch_dtype()}
            if importlib.util.find_spec("accelerate") is None:
                # Without accelerate diffusers falls back to this anyway, with a warning per load.
                kwargs["low_cpu_mem_usage"] = False
            if placement.device_map:  # spread over several devices by diffusers; no `.to()` then
                kwargs["device_map"] = placement.device_map
                limits = backends.max_memory(placement)
                if limits:
                    kwargs["max_memory"] = limits
            options = runtime_options.load_options(spec.runtime)
            if options.quantization:
                quantization.quiet_import_logs()
            with LOAD_LOCK:
                location = tiny_models.resolve_source(key.source, self.model_dir)
                kwargs.update(runtime_options.load_kwargs(options, location))
                kwargs.update(qwen_vl_processor.processor_kwargs(cls, location))  # without torchvision
                plan = self.share_plan(location, cls, key, options)
                reused = {name: module for name, module in plan.modules.items() if name not in kwargs}
                pipeline = cls.from_pretrained(location, **kwargs, **reused)
            # Before `apply`: sequential CPU offload moves weights to the meta device on purpose.
            on_meta = meta_components(pipeline)
            if on_meta:
                names = ", ".join(on_meta)
                raise ModelLoadError(spec.id, key.source, f"component(s) {names} came out on the meta device")
            runtime_options.apply(pipeline, options, placement)  # places it too
            pipeline.set_progress_bar_config(disable=True)
            with LOAD_LOCK:
                self.shared.register(plan, pipeline, spec.id)
            return pipeline, plan
        except ModelLoadError:
            raise
        except Exception as exc:
            # The client sees the reason without the worker's folders; the log keeps them.
            log.warning("loading model %s from %s (%s) failed: %s", spec.id, key.source, location, exc)
            known = {location: key.source, str(self.model_dir): "MODEL_DIR"}
            reason = redact_paths(_short_reason(exc), known, keep=[key.source])
            raise ModelLoadError(spec.id, key.source, reason) from exc

    def share_plan(
        self, location: str, cls: type, key: CacheKey, options: runtime_options.LoadOptions
    ) -> SharePlan:
        """What this load can take from loaded models; nothing with offload or a device map."""
        if key.device_map or options.cpu_offload:
            return SharePlan()  # accelerate's hooks and the placement belong to one pipeline
        root = location if os.path.isdir(location) else cached_snapshot(location)
        if root is None:
            return SharePlan()
        context = f"{key.device}|{key.dtype}|{key.options}"
        return self.shared.plan(root, cls, context)


def cached_snapshot(repo_id: str) -> str | None:
    """The local Hugging Face cache snapshot of hub id `repo_id`, when it is fully there already."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not a hub id, not cached, no huggingface_hub: nothing to share then
        return None
