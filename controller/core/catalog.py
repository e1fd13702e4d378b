"""The model catalog: models, aliases and presets from declarative files."""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterable
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

from omnirt._internal import families as family_table
from omnirt._internal.defaults import PRESET_FIELDS
from omnirt._internal.families import Family, FamilyError
from omnirt._internal.modes import DEFAULT_MODE, EXECUTION_MODES
from omnirt.controller.core.bounds import INT32_MAX, INT64_MAX, MAX_MODEL_NAME_CHARS, check_length, echo
from omnirt.errors import InvalidRequest, ModelNotFound
from omnirt.types import ModelDefaults, ModelLimits, ModelSpec, Preset, Task

# Most characters of model ids a ModelNotFound lists when nothing is close to the name asked for.
MAX_LISTED_CHARS = 120
# The preset key holding runtime options (`low-vram`: CPU offload, VAE tiling), applied as the
# request's `extra.runtime` when the request sets none.
PRESET_RUNTIME = "runtime"
# The built-in catalog files, in order: the tiny offline models, then the real models by hub id.
BUILTIN_FILES = ("catalog.toml", "hub.toml")


class CatalogError(ValueError):
    """A catalog file is malformed; the message names the file and the entry."""


def _table(cls: type, data: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise CatalogError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(names)})")
    return cls(**data)


def spec_from_dict(entry: dict[str, Any], where: str) -> ModelSpec:
    """Build a ModelSpec from one `[[models]]` table."""
    entry = dict(entry)
    model_id = entry.get("id")
    if not model_id or not isinstance(model_id, str):
        raise CatalogError(f"{where}: every model needs a string `id`")
    where = f"{where}: model {echo(model_id)}"
    for name in (model_id, *entry.get("aliases", ())):
        if isinstance(name, str) and len(name) > MAX_MODEL_NAME_CHARS:  # no request could name it
            raise CatalogError(f"{where}: id and aliases are at most {MAX_MODEL_NAME_CHARS} characters")
    try:
        tasks = [Task(x) for x in entry.pop("tasks", [])]
    except ValueError as exc:
        raise CatalogError(f"{where}: {exc}; tasks are {[t.value for t in Task]}") from None
    if not tasks:
        raise CatalogError(f"{where}: `tasks` must list at least one task")
    mode = entry.get("execution_mode", DEFAULT_MODE.value)
    if mode not in EXECUTION_MODES:
        raise CatalogError(f"{where}: execution_mode {mode!r} is not one of {list(EXECUTION_MODES)}")
    presets = [
        Preset(name=name, description=str(body.pop("description", "")), overrides=body)
        for name, body in ((n, dict(b)) for n, b in entry.pop("presets", {}).items())
    ]
    for preset in presets:
        unknown = set(preset.overrides) - {*PRESET_FIELDS, PRESET_RUNTIME}
        if unknown:
            known = sorted({*PRESET_FIELDS, PRESET_RUNTIME})
            raise CatalogError(f"{where} preset {preset.name!r}: unknown keys {sorted(unknown)} ({known})")
        if not isinstance(preset.overrides.get(PRESET_RUNTIME, {}), dict):
            raise CatalogError(f"{where} preset {preset.name!r}: `runtime` must be a table of options")
    defaults = _table(ModelDefaults, entry.pop("defaults", {}), f"{where} [defaults]")
    limits = _table(ModelLimits, entry.pop("limits", {}), f"{where} [limits]")
    for f in fields(ModelLimits):
        # Every limit travels in ModelSpec messages (DescribeModel, each Assignment).
        value = getattr(limits, f.name)
        most = INT64_MAX if f.name == "max_input_bytes" else INT32_MAX
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most):
            raise CatalogError(f"{where} [limits]: {f.name} must be a whole number from 0 to {most}")
    spec = _table(ModelSpec, entry, where)
    spec.tasks, spec.presets, spec.defaults, spec.limits = tasks, presets, defaults, limits
    return spec


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
        data = json.loads(raw) if path.suffix == ".json" else tomllib.loads(raw.decode())
    except (OSError, ValueError) as exc:
        raise CatalogError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{path}: must hold `models` and `families` tables")
    return data


def load_file(path: str | Path) -> list[ModelSpec]:
    """Read the models of one catalog file (TOML, or JSON by extension)."""
    path = Path(path)
    return [spec_from_dict(entry, str(path)) for entry in _read(path).get("models", [])]


def load_families(path: str | Path) -> list[Family]:
    """Read the `[[families]]` tables of one catalog file."""
    path = Path(path)
    try:
        return [family_table.family_from_dict(e, str(path)) for e in _read(path).get("families", [])]
    except FamilyError as exc:
        raise CatalogError(str(exc)) from None


class Catalog:
    """Models by id and alias. Later files replace entries of the same id."""

    def __init__(self, specs: Iterable[ModelSpec] = (), families: Iterable[Family] | None = None) -> None:
        self._by_id: dict[str, ModelSpec] = {}
        self._alias: dict[str, str] = {}
        self._families = dict(family_table.builtin()) if families is None else {}
        for family in families or ():
            self._families[family.id] = family
        for spec in specs:
            self.add(spec)

    @classmethod
    def load(cls, extra_files: Iterable[str | Path] = ()) -> Catalog:
        """The built-in catalog plus the user's files (their families first, then their models)."""
        specs: list[ModelSpec] = []
        for name in BUILTIN_FILES:
            with resources.as_file(resources.files("omnirt.controller.core") / name) as path:
                specs += load_file(path)
        families = list(family_table.builtin().values())
        for extra in extra_files:
            families += load_families(extra)
            specs += load_file(extra)
        return cls(specs, families)

    def add(self, spec: ModelSpec) -> None:
        """Add (or replace) a model; it runs in its family's dtype unless its runtime names one."""
        family = self._families.get(spec.family)
        if family is not None and family.dtype and "dtype" not in spec.runtime:
            spec.runtime = {**spec.runtime, "dtype": dict(family.dtype)}
        self._by_id[spec.id] = spec
        for alias in spec.aliases:
            self._alias[alias] = spec.id

    def family(self, spec: ModelSpec) -> Family | None:
        """The family table of `spec`, None for a family the catalog does not describe."""
        return self._families.get(spec.family)

    def families(self) -> list[Family]:
        return sorted(self._families.values(), key=lambda f: f.id)

    def __iter__(self) -> Any:
        return iter(sorted(self._by_id.values(), key=lambda s: s.id))

    def __len__(self) -> int:
        return len(self._by_id)

    def resolve(self, name: str) -> ModelSpec:
        """The spec for an id or alias; ModelNotFound with close matches otherwise."""
        if not name:
            raise InvalidRequest("model: required", field="model")
        # Before the lookup and the close matches (difflib is quadratic in the name's length).
        check_length("model", name, MAX_MODEL_NAME_CHARS)
        spec = self._by_id.get(name) or self._by_id.get(self._alias.get(name, ""))
        if spec is None:
            known = list(self._by_id) + list(self._alias)
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            ids = sorted(self._by_id)
            # A big catalog's full listing would outgrow the status trailer like a huge name.
            shown: list[str] = []
            for model_id in ids:
                if sum(len(x) + 2 for x in shown) + len(model_id) > MAX_LISTED_CHARS:
                    break
                shown.append(model_id)
            listed = ", ".join(shown) + (f", ... ({len(ids)} in all)" if len(shown) < len(ids) else "")
            hint = f"; did you mean {', '.join(close)}?" if close else f"; known models: {listed}"
            raise ModelNotFound(f"model {echo(name)} not found{hint}", field="model")
        return spec
