"""`ModelCache`: loaded pipelines, kept warm between requests.

Entries are keyed by (source, pipeline class, device, dtype, device map, load-time runtime
options: compile, offload, layerwise casting, quantization; `loader.CacheKey`): a second
request for the same key reuses the pipeline (no load, `cold_start` false). Loads of one key
are serialized, so two concurrent first requests load once; loads of different keys also run
one after another, under the process-wide `loader.LOAD_LOCK` (building modules is not
thread-safe). How one pipeline is loaded from its source (builtin, local folder or hub id) is
`loader.PipelineLoader`'s; a load that fails (ModelLoadError) is not cached.

Memory budget (`budget_bytes`, 0 = unlimited): a pipeline's size is the bytes of its modules'
parameters and buffers. Before a load the cache frees room for the new model (its size from
an earlier load, else its weight files on disk) by evicting the least recently used *idle*
entries; an entry handed out by `get` stays in use until `release`, and is never evicted
while in use. After the load the real size is checked again. A model bigger than the whole
budget is refused (`ModelTooLargeError`); when only in-use entries block the room, the load
goes ahead over budget and says so in `CachedPipeline.warnings`.

Components shared between models (`shared_components`: a module with byte-identical files,
class and load context is reused by a later load of another source) count once: the budget
holds the bytes of the *distinct* tensors of all held pipelines (each entry keeps its tensors'
ids and sizes from its last measurement). A model's own size (`nbytes`, what the "bigger than
the whole budget" refusal and its adapters' room use) still counts all its modules. Evicting a
model whose modules another held model still uses frees only what no one else holds, and the
count says so: those bytes stay counted, now by the other model. The pre-load room is made for
the model's full size (an earlier measurement or its files) less the bytes of the loaded modules
it will reuse, so a model that fits only by sharing does not evict its partner first.

LoRA adapters loaded later on a pipeline are part of its size: `memory(cached)` gives the
adapters code an `EntryMemory` that measures the entry again and evicts idle entries for them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from omnirt import types as t
from omnirt.worker.pipelines.loader import CacheKey, ModelLoadError, PipelineLoader, cache_key
from omnirt.worker.runtime import options as runtime_options
from omnirt.worker.runtime.backends import Placement
from omnirt.worker.tiny import registry as tiny_models

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


class ModelTooLargeError(ModelLoadError):
    """The model alone is bigger than the whole model cache budget."""


@dataclass
class _Entry:
    pipeline: Any
    load_ms: float
    model_ids: set[str] = field(default_factory=set)
    last_used: float = 0.0
    # The pipeline's bytes now (loaded adapters included); `base_nbytes` as loaded.
    nbytes: int = 0
    in_use: int = 0
    base_nbytes: int = 0
    # id -> bytes of every tensor of the pipeline: tensors shared with another entry count once.
    tensors: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CachedPipeline:
    """A pipeline handed out by the cache; `cold` when this request loaded it (`load_ms` > 0)."""

    pipeline: Any
    key: CacheKey
    cold: bool
    load_ms: float
    # Catalog ids of the models this load evicted to fit the budget.
    evicted: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    # Components this load took from other loaded models (`shared_components`).
    shared: tuple[str, ...] = ()


def tensor_bytes(tensor: Any) -> int:
    """Bytes `tensor` holds; a tensor subclass (torchao's int8 weights) by its inner tensors."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return int(tensor.numel() * tensor.element_size())


def pipeline_bytes(pipeline: Any) -> int:
    """Bytes of the parameters and buffers of `pipeline`'s torch modules (shared tensors once).

    Loaded LoRA adapters are parameters of those modules, so they are counted too.
    """
    return sum(pipeline_tensors(pipeline).values())


def pipeline_tensors(pipeline: Any) -> dict[int, int]:
    """id -> bytes of each parameter and buffer of `pipeline`'s torch modules (meta ones left out)."""
    import torch

    tensors: dict[int, int] = {}
    for component in getattr(pipeline, "components", {}).values():
        if not isinstance(component, torch.nn.Module):
            continue
        for tensor in (*component.parameters(), *component.buffers()):
            if tensor.device.type != "meta" and id(tensor) not in tensors:
                tensors[id(tensor)] = tensor_bytes(tensor)
    return tensors


def weight_file_bytes(location: str) -> int:
    """Bytes of the weight files under a local model folder (0 for a hub id): a pre-load estimate."""
    root = Path(location)
    if not root.is_dir():
        return 0
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))


def format_bytes(n: int) -> str:
    """`n` bytes for a message: `4.4 MB (4415348 bytes)`."""
    return f"{n / 1e6:.1f} MB ({n} bytes)"


def cache_warnings(cached: CachedPipeline) -> list[str]:
    """RunReport warnings of a `get`: the models its load evicted, and any over-budget load."""
    warnings = list(cached.warnings)
    if cached.evicted:
        names = ", ".join(cached.evicted)
        warnings.insert(0, f"evicted model(s) {names} from the model cache to fit its memory budget")
    return warnings


class ModelCache:
    """Pipelines loaded by this worker, by `CacheKey` (thread-safe; loads run in worker threads)."""

    def __init__(self, model_dir: str | Path, budget_bytes: int = 0) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, not {budget_bytes}")
        self.model_dir = Path(model_dir)
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._entries: dict[CacheKey, _Entry] = {}
        self._load_locks: dict[CacheKey, threading.Lock] = {}
        # Real sizes of models loaded before (evicted ones too): better than a disk estimate.
        self._known_bytes: dict[CacheKey, int] = {}
        self._loader = PipelineLoader(self.model_dir)

    def get(
        self, spec: t.ModelSpec, placement: Placement, on_load_start: Callable[[], None] | None = None
    ) -> CachedPipeline:
        """The pipeline for `spec`, loading it first if needed (`on_load_start` is called then).

        The entry is in use until `release(result)`. Raises ModelLoadError when the model
        cannot be loaded (ModelTooLargeError when it exceeds the budget); failures are not cached.
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
            estimate, exact = self._estimate(key)
            reused = self._reusable_bytes(spec, key)
            evicted = self._make_room(spec, key, estimate, refuse=exact, reused=reused)
            pipeline, plan = self._loader.load(spec, key, placement)
            load_ms = (time.perf_counter() - started) * 1000.0
            tensors = pipeline_tensors(pipeline)
            nbytes = sum(tensors.values())
            self._known_bytes[key] = nbytes
            evicted += self._make_room(spec, key, nbytes, refuse=True, pending=tensors)
            warnings = self._over_budget_warning(spec, tensors)
            with self._lock:
                self._entries[key] = _Entry(
                    pipeline, load_ms, {spec.id}, time.monotonic(), nbytes, 1, nbytes, tensors
                )
            shared = f"; shared {plan.summary()}" if plan.modules else ""
            log.info(
                "loaded model %s from %s in %.0f ms (%s%s)",
                spec.id,
                key.source,
                load_ms,
                format_bytes(nbytes),
                shared,
            )
            return CachedPipeline(
                pipeline,
                key,
                cold=True,
                load_ms=load_ms,
                evicted=tuple(evicted),
                warnings=warnings,
                shared=tuple(sorted(plan.modules)),
            )

    def release(self, cached: CachedPipeline) -> None:
        """The caller is done with `cached` (from `get`): its entry may be evicted again once idle."""
        with self._lock:
            entry = self._entries.get(cached.key)
            if entry is not None and entry.pipeline is cached.pipeline and entry.in_use > 0:
                entry.in_use -= 1
                entry.last_used = time.monotonic()

    def _estimate(self, key: CacheKey) -> tuple[int, bool]:
        """(bytes `key` will take, whether that is exact: measured at an earlier load)."""
        if not self.budget_bytes:
            return 0, False
        known = self._known_bytes.get(key)
        if known is not None:
            return known, True
        location = tiny_models.source_location(key.source, self.model_dir)
        # Files may hold another dtype than the one loaded: an estimate only, capped at the budget.
        return min(weight_file_bytes(location), self.budget_bytes), False

    def _make_room(
        self,
        spec: t.ModelSpec,
        key: CacheKey,
        nbytes: int,
        *,
        refuse: bool,
        pending: dict[int, int] | None = None,
        reused: int = 0,
    ) -> list[str]:
        """Evict idle entries, least recently used first, until `nbytes` more fit the budget.

        With `refuse`, `nbytes` is exact and a model bigger than the budget is an error. With
        `pending` (the loaded model's tensors) room is made for those not held already instead;
        `reused`: bytes of `nbytes` that are loaded modules the load will reuse (no room needed).
        """
        if not self.budget_bytes:
            return []
        if refuse and nbytes > self.budget_bytes:
            reason = (
                f"the model needs {format_bytes(nbytes)}, more than the whole model cache budget of "
                f"{format_bytes(self.budget_bytes)} (--model-cache-bytes / OMNIRT_MODEL_CACHE_BYTES)"
            )
            raise ModelTooLargeError(spec.id, key.source, reason)
        if pending is not None:
            return self._evict_for(key, 0, pending)
        return self._evict_for(key, max(0, nbytes - reused))

    def _reusable_bytes(self, spec: t.ModelSpec, key: CacheKey) -> int:
        """Bytes of the loaded modules a load of `key` would reuse (0 without a budget)."""
        if not self.budget_bytes:
            return 0
        try:
            import diffusers

            cls = getattr(diffusers, key.pipeline_class)
            location = tiny_models.source_location(key.source, self.model_dir)
            plan = self._loader.share_plan(location, cls, key, runtime_options.load_options(spec.runtime))
        except Exception:  # an estimate only: the load reports what is wrong
            return 0
        return pipeline_bytes(SimpleNamespace(components=plan.modules))

    def _evict_for(self, key: CacheKey, nbytes: int, pending: dict[int, int] | None = None) -> list[str]:
        """Evict idle entries other than `key`, LRU first, until `nbytes` more fit the budget.

        `pending`: tensors about to be held as well (a tensor an entry holds too counts once).
        """
        evicted: list[str] = []
        with self._lock:
            idle = sorted((e.last_used, k) for k, e in self._entries.items() if k != key and e.in_use == 0)
            for _, victim in idle:
                if self._held_bytes(extra=pending) + nbytes <= self.budget_bytes:
                    break
                entry = self._entries.pop(victim)
                evicted.extend(sorted(entry.model_ids))
                log.info(
                    "evicted model %s (%s) to fit the model cache budget",
                    ", ".join(sorted(entry.model_ids)),
                    format_bytes(entry.nbytes),
                )
        if evicted:
            _free_memory()
        return evicted

    def memory(self, cached: CachedPipeline) -> EntryMemory:
        """The budget as seen by `cached` (in use) when it grows: loaded adapters."""
        return EntryMemory(self, cached.key)

    def _held_bytes(self, extra: dict[int, int] | None = None) -> int:
        """Bytes of the distinct tensors of all entries (and of `extra`): shared modules once."""
        tensors = dict(extra or {})
        for entry in self._entries.values():
            tensors.update(entry.tensors)
        return sum(tensors.values())

    def _over_budget_warning(self, spec: t.ModelSpec, tensors: dict[int, int]) -> tuple[str, ...]:
        if not self.budget_bytes:
            return ()
        with self._lock:
            held = self._held_bytes()
            total = self._held_bytes(extra=tensors)
        nbytes = total - held  # what this load adds: its components shared with others are held
        if total <= self.budget_bytes:
            return ()
        text = (
            f"model cache over budget: {spec.id} ({format_bytes(nbytes)}) loaded beside "
            f"{format_bytes(held)} in use by running jobs; budget {format_bytes(self.budget_bytes)}"
        )
        log.warning("%s", text)
        return (text,)

    def _lookup(self, key: CacheKey, model_id: str) -> CachedPipeline | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            entry.model_ids.add(model_id)
            entry.last_used = time.monotonic()
            entry.in_use += 1
            return CachedPipeline(entry.pipeline, key, cold=False, load_ms=0.0)

    def loaded_models(self) -> list[str]:
        """Catalog ids of the models held (sorted)."""
        with self._lock:
            return sorted({model_id for entry in self._entries.values() for model_id in entry.model_ids})

    def model_bytes(self) -> dict[str, int]:
        """Catalog id -> bytes of the pipeline it is held in (a pipeline of several ids: each)."""
        with self._lock:
            return {m: entry.nbytes for entry in self._entries.values() for m in entry.model_ids}

    def evict(self, model_id: str) -> tuple[bool, bool]:
        """Drop the idle entries that hold `model_id` (an operator's unload); returns (whether
        one was dropped, whether one still holding it is in use and was kept)."""
        with self._lock:
            held = [k for k, e in self._entries.items() if model_id in e.model_ids]
            idle = [k for k in held if self._entries[k].in_use == 0]
            for key in idle:
                entry = self._entries.pop(key)
                log.info(
                    "unloaded model %s (%s)", ", ".join(sorted(entry.model_ids)), format_bytes(entry.nbytes)
                )
        if idle:
            _free_memory()
        return bool(idle), len(idle) < len(held)

    def held_bytes(self) -> int:
        """Bytes of the pipelines held (what the budget counts)."""
        with self._lock:
            return self._held_bytes()

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
        _free_memory()


class EntryMemory:
    """One in-use entry's share of the budget, for what it loads after the model (LoRA adapters).

    The entry's size is measured again after each change (`remeasure`); `make_room` evicts idle
    *other* entries, least recently used first. Warnings about evictions collect in `warnings`.
    """

    def __init__(self, cache: ModelCache, key: CacheKey) -> None:
        self._cache = cache
        self._key = key
        self.warnings: list[str] = []

    @property
    def budget_bytes(self) -> int:
        """The cache's budget (0 = unlimited)."""
        return self._cache.budget_bytes

    def _entry(self) -> _Entry | None:
        return self._cache._entries.get(self._key)

    def base_bytes(self) -> int:
        """The entry's size as loaded (without adapters)."""
        with self._cache._lock:
            entry = self._entry()
            return entry.base_nbytes if entry else 0

    def over_by(self, nbytes: int) -> int:
        """How far `nbytes` more would go over the budget (<= 0: they fit; always fits without one)."""
        if not self.budget_bytes:
            return 0
        with self._cache._lock:
            return self._cache._held_bytes() + nbytes - self.budget_bytes

    def make_room(self, nbytes: int, what: str) -> None:
        """Evict idle other entries (LRU) until `nbytes` more fit, saying so in `warnings`."""
        if self.over_by(nbytes) <= 0:
            return
        evicted = self._cache._evict_for(self._key, nbytes)  # the held bytes include this entry
        if evicted:
            names = ", ".join(evicted)
            self.warnings.append(f"evicted model(s) {names} from the model cache to fit {what}")

    def remeasure(self) -> int:
        """Measure the entry again (after adapters were loaded or deleted); its new size."""
        with self._cache._lock:
            entry = self._entry()
        if entry is None:
            return 0
        tensors = pipeline_tensors(entry.pipeline)
        nbytes = sum(tensors.values())
        with self._cache._lock:
            entry.nbytes = nbytes
            entry.tensors = tensors
        return nbytes


def _cached_snapshot(repo_id: str) -> str | None:
    """The local Hugging Face cache snapshot of hub id `repo_id`, when it is fully there already."""
    try:
        from huggingface_hub import snapshot_download

        return str(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not a hub id, not cached, no huggingface_hub: nothing to share then
        return None


def _free_memory() -> None:
    """Return freed accelerator memory to the device (evicted pipelines are garbage by now)."""
    import gc

    gc.collect()
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
