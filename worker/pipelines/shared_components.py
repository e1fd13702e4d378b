"""`SharedComponents`: a module already loaded by one model is reused by another model's load.

Models of different sources often ship the same component: Wan 2.1 T2V-14B and I2V-14B the same
11 GB UMT5-XXL text encoder and VAE, SDXL base and refiner a VAE and text_encoder_2, Flux dev and
schnell T5, CLIP and VAE. The model cache keys loads by source, so it would load them twice;
instead it passes the loaded module to `from_pretrained(path, text_encoder=module)`.

Two components are the same when their class (from `model_index.json`), their files and the
load context (device, dtype, device map, load options key) are the same. A file's identity is
free in a Hugging Face cache snapshot (the blob a snapshot file links to is named by its
content hash: sha256 for LFS weights, the git sha1 for small files); anywhere else it is the
sha256 of its content, computed once per (realpath, size, mtime_ns) per process. Hashing an
11 GB folder takes tens of seconds, so it is done only for a candidate: a component is first
matched by a cheap key (class, config.json, file names and sizes, context) and only then are the
two folders' files hashed.

Not shared, because something changes them in place for one model:
- the denoisers (`unet`, `transformer`, `transformer_2`): torch_compile, layerwise casting and
  step caches change them;
- the modules LoRA adapters load into (the pipeline class's `_lora_loadable_modules`: SD's
  text_encoder, SDXL's two text encoders, Flux's CLIP text encoder): peft injects its layers
  into the module, and adapters are activated per pipeline under that pipeline's own lock;
- everything of a model loaded with CPU offload or a device map (accelerate's hooks and the
  placement are per pipeline);
- what is not a torch module (tokenizers, schedulers: cheap, and schedulers keep state).

The index holds weak references: once no cached pipeline uses a module, it leaves the index.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NEVER_SHARED = ("unet", "transformer", "transformer_2")
_BLOB_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_HASH_CHUNK = 8 << 20

_file_hashes: dict[tuple[str, int, int], str] = {}
_file_hashes_lock = threading.Lock()


def file_identity(path: Path) -> str:
    """A content hash of `path`: its HF cache blob's name, else its sha256 (cached per file state)."""
    real = os.path.realpath(path)
    name = os.path.basename(real)
    if os.path.basename(os.path.dirname(real)) == "blobs" and _BLOB_NAME.fullmatch(name):
        return name
    stat = os.stat(real)
    state = (real, stat.st_size, stat.st_mtime_ns)
    with _file_hashes_lock:
        known = _file_hashes.get(state)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with open(real, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    with _file_hashes_lock:
        _file_hashes[state] = value
    return value


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def folder_fingerprint(folder: Path) -> str:
    """The identity of everything in a component folder (names and contents, config.json too)."""
    digest = hashlib.sha256()
    for path in _files(folder):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_identity(path)}\n".encode())
    return digest.hexdigest()


def _file_states(folder: Path) -> tuple[tuple[str, int, int], ...]:
    states = []
    for path in _files(folder):
        stat = path.stat()
        states.append((os.path.realpath(path), stat.st_size, stat.st_mtime_ns))
    return tuple(states)


def _cheap_key(folder: Path, class_entry: Any, context: str) -> str:
    config = folder / "config.json"
    parts = [json.dumps(class_entry), context, config.read_text() if config.is_file() else ""]
    parts += [f"{p.relative_to(folder).as_posix()}:{p.stat().st_size}" for p in _files(folder)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def unshared_names(pipeline_class: type) -> set[str]:
    """Components of `pipeline_class` that may never be shared (see the module docstring)."""
    return set(NEVER_SHARED) | set(getattr(pipeline_class, "_lora_loadable_modules", ()) or ())


@dataclass
class _Held:
    """A loaded component: its folder, the module (weakly) and the model that loaded it."""

    folder: Path
    module: weakref.ref[Any]
    owner: str
    # The folder's files as loaded: a folder changed on disk since then is no longer a match.
    files: tuple[tuple[str, int, int], ...]


@dataclass
class SharePlan:
    """What one load reuses: modules by component name, and the model each comes from."""

    modules: dict[str, Any] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    # Every shareable component of the load: name -> (folder, cheap key), for `register`.
    candidates: dict[str, tuple[Path, str]] = field(default_factory=dict)

    def summary(self) -> str:
        """`text_encoder, vae with tiny-a` (grouped by the model they come from); "" when none."""
        by_owner: dict[str, list[str]] = {}
        for name, owner in sorted(self.owners.items()):
            by_owner.setdefault(owner, []).append(name)
        return "; ".join(f"{', '.join(names)} with {owner}" for owner, names in by_owner.items())


class SharedComponents:
    """The loaded components of one model cache, by cheap key (thread-safe).

    The model cache plans a load and registers its modules under its LOAD_LOCK, so a load sees
    every load that finished before it (one still being placed may be missed: loaded twice).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, list[_Held]] = {}

    def plan(self, location: str, pipeline_class: type, context: str) -> SharePlan:
        """The loaded modules a load of `location` (a local folder) in `context` can reuse."""
        plan = SharePlan()
        root = Path(location)
        index = root / "model_index.json"
        if not index.is_file():
            return plan
        try:
            entries = json.loads(index.read_text())
        except (OSError, ValueError):
            return plan  # from_pretrained says what is wrong with it
        excluded = unshared_names(pipeline_class)
        for name, entry in entries.items():
            folder = root / name
            if name.startswith("_") or name in excluded or not isinstance(entry, list) or not folder.is_dir():
                continue
            key = _cheap_key(folder, entry, context)
            plan.candidates[name] = (folder, key)
            found = self._find(key, folder)
            if found is not None:
                plan.modules[name], plan.owners[name] = found
        return plan

    def _find(self, key: str, folder: Path) -> tuple[Any, str] | None:
        with self._lock:
            held = self._held.get(key, [])
            held[:] = [h for h in held if h.module() is not None]
            candidates = list(held)
        for each in candidates:
            module = each.module()
            if module is None or _file_states(each.folder) != each.files:
                continue
            same_folder = os.path.realpath(each.folder) == os.path.realpath(folder)
            if same_folder or folder_fingerprint(each.folder) == folder_fingerprint(folder):
                return module, each.owner
        return None

    def register(self, plan: SharePlan, pipeline: Any, model_id: str) -> None:
        """Offer the torch modules `pipeline` loaded itself (not the reused ones) to later loads."""
        import torch

        with self._lock:
            for name, (folder, key) in plan.candidates.items():
                module = getattr(pipeline, "components", {}).get(name)
                if name in plan.modules or not isinstance(module, torch.nn.Module):
                    continue
                self._held.setdefault(key, []).append(
                    _Held(folder, weakref.ref(module), model_id, _file_states(folder))
                )

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for held in self._held.values() for h in held if h.module() is not None)
