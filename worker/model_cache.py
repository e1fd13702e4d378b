"""`ModelCache`: loaded pipelines, kept warm between requests.

Entries are keyed by (source, pipeline class, device, dtype): a second request for the same
key reuses the pipeline (no load, `cold_start` false). Loads of one key are serialized, so
two concurrent first requests load once; loads of different keys may overlap.

Every source goes through the same loading code: `builtin:NAME` is first built into
`model_dir/NAME` (see `tiny_models`) and then loaded from that path like any local model or
hub id with `from_pretrained`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnirt import types as t
from omnirt.worker import tiny_models
from omnirt.worker.backends import Placement

log = logging.getLogger(__name__)

DEFAULT_PIPELINE_CLASS = "DiffusionPipeline"


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


@dataclass
class _Entry:
    pipeline: Any
    load_ms: float
    model_ids: set[str] = field(default_factory=set)
    last_used: float = 0.0


@dataclass(frozen=True)
class CachedPipeline:
    """A pipeline handed out by the cache; `cold` when this request loaded it (`load_ms` > 0)."""

    pipeline: Any
    key: CacheKey
    cold: bool
    load_ms: float


def cache_key(spec: t.ModelSpec, placement: Placement) -> CacheKey:
    """The cache key of `spec` placed on `placement`."""
    return CacheKey(
        source=spec.source or spec.id,
        pipeline_class=spec.pipeline_class or DEFAULT_PIPELINE_CLASS,
        device=placement.device,
        dtype=placement.dtype,
    )


def _dtype_argument() -> str:
    """`dtype` on diffusers that renamed it (0.42+, where `torch_dtype` warns), else `torch_dtype`."""
    try:
        from diffusers.utils import deprecation_utils
    except ImportError:
        return "torch_dtype"
    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


def _short_reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 600 else text[:597] + "..."


class ModelCache:
    """Pipelines loaded by this worker, by `CacheKey` (thread-safe; loads run in worker threads)."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, _Entry] = {}
        self._load_locks: dict[CacheKey, threading.Lock] = {}

    def get(
        self, spec: t.ModelSpec, placement: Placement, on_load_start: Callable[[], None] | None = None
    ) -> CachedPipeline:
        """The pipeline for `spec`, loading it first if needed (`on_load_start` is called then).

        Raises ModelLoadError when the model cannot be loaded; failures are not cached.
        """
        key = cache_key(spec, placement)
        warm = self._lookup(key, spec.id)
        if warm is not None:
            return warm
        with self._lock:
            load_lock = self._load_locks.setdefault(key, threading.Lock())
        with load_lock:
            warm = self._lookup(key, spec.id)
            if warm is not None:
                return warm
            if on_load_start is not None:
                on_load_start()
            started = time.perf_counter()
            pipeline = self._load(spec, key, placement)
            load_ms = (time.perf_counter() - started) * 1000.0
            with self._lock:
                self._entries[key] = _Entry(pipeline, load_ms, {spec.id}, time.monotonic())
            log.info("loaded model %s from %s in %.0f ms", spec.id, key.source, load_ms)
            return CachedPipeline(pipeline, key, cold=True, load_ms=load_ms)

    def _lookup(self, key: CacheKey, model_id: str) -> CachedPipeline | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            entry.model_ids.add(model_id)
            entry.last_used = time.monotonic()
            return CachedPipeline(entry.pipeline, key, cold=False, load_ms=0.0)

    def _load(self, spec: t.ModelSpec, key: CacheKey, placement: Placement) -> Any:
        try:
            import diffusers
            from diffusers.utils import logging as diffusers_logging

            diffusers_logging.disable_progress_bar()
            cls = getattr(diffusers, key.pipeline_class, None)
            if not isinstance(cls, type) or not issubclass(cls, diffusers.DiffusionPipeline):
                raise ModelLoadError(spec.id, key.source, f"unknown pipeline class {key.pipeline_class!r}")
            location = self._resolve_source(key.source)
            kwargs: dict[str, Any] = {_dtype_argument(): placement.torch_dtype()}
            if importlib.util.find_spec("accelerate") is None:
                # Without accelerate diffusers falls back to this anyway, with a warning per load.
                kwargs["low_cpu_mem_usage"] = False
            pipeline = cls.from_pretrained(location, **kwargs)
            if placement.device != "cpu":
                pipeline.to(placement.device)
            pipeline.set_progress_bar_config(disable=True)
            return pipeline
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(spec.id, key.source, _short_reason(exc)) from exc

    def _resolve_source(self, source: str) -> str:
        name = tiny_models.builtin_name(source)
        if name is not None:
            return str(tiny_models.ensure_builtin(name, self.model_dir))
        expanded = os.path.expanduser(source)
        return expanded if os.path.exists(expanded) else source

    def loaded_models(self) -> list[str]:
        """Catalog ids of the models held (sorted)."""
        with self._lock:
            return sorted({model_id for entry in self._entries.values() for model_id in entry.model_ids})

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        """Drop every pipeline (their memory is freed once no run uses them)."""
        with self._lock:
            self._entries.clear()
