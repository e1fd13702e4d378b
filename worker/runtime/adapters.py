"""LoRA adapters per request: where an adapter may come from, and how it is applied to one call.

An adapter name is either a catalog-level name (`runtime.adapters = {name = "path"}` in the
model's entry: the operator's choice, trusted) or a path inside the allowed folders: the
worker's `model_dir` and the model's `runtime.adapter_dirs`. A relative path is looked up
in each allowed folder in turn; an absolute one must lie inside one of them. Symlinks are
resolved before the check, so neither `..` nor a link can reach outside; a path leading out
gets the answer of a missing one.

Loaded adapters stay on the pipeline (diffusers `load_lora_weights(..., adapter_name=...)`)
in a bounded LRU per pipeline (`runtime.max_loaded_adapters`, default 8). A call with
adapters activates exactly its own (`set_adapters(names, adapter_weights=scales)`) and
disables LoRA again afterwards, so nothing leaks into the next request. Calls with adapters
(or anything else that changes shared modules for one call: a step cache) hold the pipeline
exclusively; calls without share it (their resting state is "LoRA off").

Loaded adapters count against the model cache budget (`AdapterMemory`, from the model cache):
before a load, this pipeline's adapters that the call does not use are unloaded (LRU) until
the new one fits, then idle models are evicted; an adapter that cannot fit beside the model
even then is refused (FAILED_PRECONDITION). Sizes are measured after each load.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from omnirt import types as t
from omnirt._internal.limits import ECHO_CHARS, MAX_ADAPTER_NAME_CHARS, MAX_ADAPTER_SCALE, MAX_FILE_NAME_BYTES
from omnirt.worker.failures import JobFailure
from omnirt.worker.pipelines.loader import LOAD_LOCK
from omnirt.worker.redact import redact_paths

log = logging.getLogger(__name__)

INVALID_ARGUMENT = "INVALID_ARGUMENT"
DEFAULT_MAX_LOADED = 8


@dataclass(frozen=True)
class ResolvedAdapter:
    """One adapter of a request: its name as asked, the real path, its scale and its index."""

    name: str
    path: Path
    scale: float
    index: int

    @property
    def adapter_name(self) -> str:
        """The name it is loaded under (peft module keys may not contain dots or slashes)."""
        return "omnirt_" + hashlib.sha1(str(self.path).encode()).hexdigest()[:16]

    def report(self) -> dict[str, Any]:
        """What `config_resolved["adapters"]` lists for it."""
        return {"name": self.name, "scale": self.scale, "path": str(self.path)}


def allowed_dirs(runtime: Mapping[str, Any], model_dir: str | Path) -> list[Path]:
    """The folders adapter paths may point into (real paths; missing ones are skipped)."""
    extra = runtime.get("adapter_dirs") or []
    if isinstance(extra, str):
        extra = [extra]
    folders = [Path(model_dir), *(Path(os.path.expanduser(str(d))) for d in extra)]
    return [Path(os.path.realpath(f)) for f in folders if f.is_dir()]


def _inside(path: Path, folders: Sequence[Path]) -> bool:
    return any(path == folder or path.is_relative_to(folder) for folder in folders)


def resolve(
    adapters: Sequence[t.Adapter], runtime: Mapping[str, Any], model_dir: str | Path
) -> list[ResolvedAdapter]:
    """Check a request's adapters; JobFailure(INVALID_ARGUMENT) on the first bad one, naming
    `adapters[i].name` for a name no file system could hold, else `adapters[i]`.

    Messages never show the worker's folders (only the name as asked, shortened).
    """
    if not adapters:
        return []
    catalog = runtime.get("adapters") or {}
    folders = allowed_dirs(runtime, model_dir)
    resolved: list[ResolvedAdapter] = []
    seen: set[Path] = set()
    for index, adapter in enumerate(adapters):
        where = f"adapters[{index}]"
        name = adapter.name.strip()
        if not name:
            raise _refuse(where, "an adapter needs a name")
        _check_name(name, f"{where}.name")
        shown = _echo(name)
        if name in catalog:
            path = Path(os.path.realpath(os.path.expanduser(str(catalog[name]))))
            if not path.exists():
                raise _refuse(where, f"adapter {shown} points to a missing path")
        else:
            path = _resolve_path(name, folders, where)
        if path in seen:
            raise _refuse(where, f"adapter {shown} is listed twice")
        seen.add(path)
        if not (adapter.scale == adapter.scale) or abs(adapter.scale) > MAX_ADAPTER_SCALE:  # NaN or absurd
            raise _refuse(f"{where}.scale", f"adapter scale {adapter.scale} is out of range")
        resolved.append(ResolvedAdapter(name, path, float(adapter.scale), index))
    return resolved


def _refuse(where: str, reason: str) -> JobFailure:
    return JobFailure(INVALID_ARGUMENT, f"{where}: {reason}", where)


def _echo(name: str) -> str:
    return repr(name if len(name) <= ECHO_CHARS else name[: ECHO_CHARS - 3] + "...")


def _check_name(name: str, where: str) -> None:
    """Refuse a name no path can be made of (before it reaches the file system: its error would
    show the worker's folders); the controller checks the same, an older one may not."""
    if len(name) > MAX_ADAPTER_NAME_CHARS:
        raise _refuse(where, f"at most {MAX_ADAPTER_NAME_CHARS} characters (got {len(name)})")
    if not name.isprintable():
        raise _refuse(where, f"may not contain control characters (got {_echo(name)})")
    if any(len(part.encode()) > MAX_FILE_NAME_BYTES for part in name.split("/")):
        raise _refuse(where, f"each part of a path is at most {MAX_FILE_NAME_BYTES} bytes")


def _resolve_path(name: str, folders: Sequence[Path], where: str) -> Path:
    if ".." in Path(name).parts:
        raise _refuse(where, f"adapter path {_echo(name)} may not contain '..'")
    raw = Path(os.path.expanduser(name))
    candidates = [raw] if raw.is_absolute() else [folder / raw for folder in folders]
    for candidate in candidates:
        try:
            if not candidate.exists():
                continue
            real = Path(os.path.realpath(candidate))
        except (OSError, ValueError):  # a name the file system refuses: looked for like a missing one
            continue
        # A path leading out of the folders gets a missing one's answer: an answer of its own
        # would tell a client which files the worker has (`/etc/shadow` against `/etc/nope`).
        if _inside(real, folders):
            return real
    reason = (
        f"adapter {_echo(name)} is neither a catalog adapter nor a path in the allowed adapter folders "
        "(the worker's model dir and the model's runtime.adapter_dirs)"
    )
    raise _refuse(where, reason)


_EXCLUSIVE = object()  # what an exclusive caller waits for, among the adapter sets


class _AdapterLock:
    """Who may use a pipeline's modules at once: the calls of one adapter set (a key; () for none)
    together, or one exclusive holder. The first holder of a set makes it active (`setup`, under
    the lock, before anyone shares it) and the last one turns it off (`teardown`); a call of
    another set, or an exclusive one, waits until the holders are done, and meanwhile no new call
    of the set in use gets in: one set's stream of calls never starves another's."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._holders = 0
        self._key: Hashable = ()
        self._exclusive = False
        # Callers waiting, by the set they wait to hold (`_EXCLUSIVE` for an exclusive one).
        self._waiting: dict[Hashable, int] = {}

    def _may_enter(self, key: Hashable, mark: Hashable) -> bool:
        if self._exclusive:
            return False
        if self._holders == 0:  # the set waited for longest goes first (dicts keep their order)
            return next(iter(self._waiting)) == mark
        return mark is not _EXCLUSIVE and self._key == key and set(self._waiting) <= {key}

    @contextlib.contextmanager
    def hold(
        self,
        key: Hashable = (),
        exclusive: bool = False,
        setup: Callable[[], None] | None = None,
        teardown: Callable[[], None] | None = None,
    ) -> Iterator[None]:
        with self._cond:
            mark = _EXCLUSIVE if exclusive else key
            self._waiting[mark] = self._waiting.get(mark, 0) + 1
            try:
                self._cond.wait_for(lambda: self._may_enter(key, mark))
            finally:
                self._waiting[mark] -= 1
                if not self._waiting[mark]:
                    del self._waiting[mark]
            if self._holders == 0 and setup is not None:
                setup()  # raises before anything is held
            self._exclusive = exclusive
            self._key = key
            self._holders += 1
        try:
            yield
        finally:
            with self._cond:
                self._holders -= 1
                self._exclusive = False
                try:
                    if self._holders == 0 and teardown is not None:
                        teardown()
                finally:
                    self._cond.notify_all()


class PipelineAdapters:
    """The adapters loaded on one pipeline, least recently used first, and their sizes."""

    def __init__(self) -> None:
        self.lock = _AdapterLock()
        self.loaded: OrderedDict[str, Path] = OrderedDict()
        self.sizes: dict[str, int] = {}  # bytes, measured at the load (kept after an unload)


class AdapterMemory(Protocol):
    """What `applied` needs from the model cache to keep adapters within its budget."""

    warnings: list[str]

    @property
    def budget_bytes(self) -> int: ...

    def base_bytes(self) -> int: ...

    def over_by(self, nbytes: int) -> int: ...

    def make_room(self, nbytes: int, what: str) -> None: ...

    def remeasure(self) -> int: ...


_STATES_LOCK = threading.Lock()


def _state(pipeline: Any) -> PipelineAdapters:
    # Kept on the pipeline object, so the state dies with the pipeline (evicted from the cache).
    state = getattr(pipeline, "_omnirt_adapters", None)
    if state is None:
        with _STATES_LOCK:
            state = getattr(pipeline, "_omnirt_adapters", None)
            if state is None:
                state = PipelineAdapters()
                pipeline._omnirt_adapters = state
    assert isinstance(state, PipelineAdapters)
    return state


def max_loaded(runtime: Mapping[str, Any]) -> int:
    """`runtime.max_loaded_adapters` (at least 1)."""
    try:
        return max(1, int(runtime.get("max_loaded_adapters", DEFAULT_MAX_LOADED)))
    except (TypeError, ValueError):
        return DEFAULT_MAX_LOADED


@contextlib.contextmanager
def applied(
    pipeline: Any,
    adapters: Sequence[ResolvedAdapter],
    runtime: Mapping[str, Any],
    *,
    exclusive: bool = False,
    memory: AdapterMemory | None = None,
) -> Iterator[None]:
    """Run the body with exactly `adapters` active on `pipeline` (none: LoRA off), then turn them off.

    `pipeline` is the cached (base) pipeline: pipelines derived from it share its modules.
    `exclusive` holds it alone even without adapters (the body changes shared modules).
    Raises JobFailure(INVALID_ARGUMENT, `adapters[i]`) when an adapter cannot be loaded, and
    FAILED_PRECONDITION when it cannot fit in the model cache budget beside the model.
    """
    state = _state(pipeline)
    if not adapters:
        with state.lock.hold((), exclusive=exclusive):
            yield
        return
    if not hasattr(pipeline, "load_lora_weights"):
        raise _refuse("adapters[0]", f"{type(pipeline).__name__} does not take LoRA adapters")

    def setup() -> None:
        keep = {a.adapter_name for a in adapters}
        for adapter in adapters:
            if memory is not None and adapter.adapter_name not in state.loaded:
                _make_room(pipeline, state, adapter, keep, memory)
            _ensure_loaded(pipeline, state, adapter, max_loaded(runtime), memory)
        pipeline.enable_lora()
        pipeline.set_adapters([a.adapter_name for a in adapters], adapter_weights=[a.scale for a in adapters])

    # Calls of the same adapter set share the pipeline (and their denoiser's steps, in the step
    # engine); another set waits until they are done.
    key = tuple((a.adapter_name, float(a.scale)) for a in adapters)
    with state.lock.hold(key, exclusive=exclusive, setup=setup, teardown=pipeline.disable_lora):
        yield


def file_bytes(path: Path) -> int:
    """Bytes of an adapter's weight file(s) on disk: the estimate before its first load."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.glob("*.safetensors")) + sum(
        p.stat().st_size for p in path.glob("*.bin")
    )


def _make_room(
    pipeline: Any, state: PipelineAdapters, adapter: ResolvedAdapter, keep: set[str], memory: AdapterMemory
) -> None:
    """Free budget for `adapter`: unload unused adapters of this pipeline (LRU), then idle models."""
    if not memory.budget_bytes:
        return
    name = adapter.adapter_name
    need = state.sizes.get(name) or file_bytes(adapter.path)
    kept = sum(state.sizes.get(n, 0) for n in keep if n in state.loaded)
    if memory.base_bytes() + kept + need > memory.budget_bytes:
        reason = (
            f"adapter {adapter.name!r} needs about {need} bytes; with the model "
            f"({memory.base_bytes()} bytes) and this request's other adapters it exceeds the "
            f"model cache budget of {memory.budget_bytes} bytes (--model-cache-bytes)"
        )
        where = f"adapters[{adapter.index}]"
        raise JobFailure("FAILED_PRECONDITION", f"{where}: {reason}", where)
    unloaded: list[str] = []
    for victim in [n for n in state.loaded if n not in keep]:  # least recently used first
        if memory.over_by(need) <= 0:
            break
        unloaded.append(str(state.loaded.pop(victim)))
        pipeline.delete_adapters(victim)
        memory.remeasure()
    if unloaded:
        names = ", ".join(unloaded)
        text = f"unloaded adapter(s) {names} to fit adapter {adapter.name!r} in the model cache budget"
        memory.warnings.append(text)
    memory.make_room(need, f"adapter {adapter.name!r}")
    if memory.over_by(need) > 0:
        memory.warnings.append(
            f"model cache over budget: adapter {adapter.name!r} loaded beside models in use by running jobs"
        )


def _ensure_loaded(
    pipeline: Any,
    state: PipelineAdapters,
    adapter: ResolvedAdapter,
    limit: int,
    memory: AdapterMemory | None = None,
) -> None:
    name = adapter.adapter_name
    if name in state.loaded:
        state.loaded.move_to_end(name)
        return
    while len(state.loaded) >= limit:
        oldest, _ = state.loaded.popitem(last=False)
        pipeline.delete_adapters(oldest)
    before = memory.remeasure() if memory is not None else 0
    path = adapter.path
    kwargs: dict[str, Any] = {"adapter_name": name}
    location: str = str(path)
    if path.is_file():
        location, kwargs["weight_name"] = str(path.parent), path.name
    try:
        # LoRA layers are new modules: built under the model cache's process-wide load lock.
        with LOAD_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # peft warns about several adapters on one model: intended
            pipeline.load_lora_weights(location, **kwargs)
    except Exception as exc:
        with contextlib.suppress(Exception):
            pipeline.delete_adapters(name)
        log.warning("loading adapter %s from %s failed: %s", adapter.name, path, exc)
        text = redact_paths(" ".join(str(exc).split()))[:300] or type(exc).__name__
        raise _refuse(
            f"adapters[{adapter.index}]", f"cannot load adapter {_echo(adapter.name)}: {text}"
        ) from exc
    finally:
        # Loading activates the new adapter; the caller decides what runs.
        with contextlib.suppress(Exception):
            pipeline.disable_lora()
    state.loaded[name] = path
    if memory is not None:
        state.sizes[name] = max(0, memory.remeasure() - before)


def adapter_bytes(pipeline: Any, adapter: ResolvedAdapter) -> int | None:
    """Measured bytes of `adapter` loaded on `pipeline` (None when not measured)."""
    state = getattr(pipeline, "_omnirt_adapters", None)
    return state.sizes.get(adapter.adapter_name) if isinstance(state, PipelineAdapters) else None


def loaded_adapters(pipeline: Any) -> list[str]:
    """Paths of the adapters loaded on `pipeline`, least recently used first."""
    state = getattr(pipeline, "_omnirt_adapters", None)
    return [str(p) for p in state.loaded.values()] if isinstance(state, PipelineAdapters) else []
