"""The model catalog: models, aliases and presets from declarative files."""

from __future__ import annotations

import difflib
import json
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields
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
# The table of the built-in files that lists the original OmniRT's model ids this build does not
# serve (its other ids are aliases of catalog entries; docs/migrating.md).
NOT_SERVED_TABLE = "original_not_served"


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
    if "@" in model_id:  # `model@backend` names the queue of its jobs pinned to a backend
        raise CatalogError(f"{where}: an id may not contain '@'")
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


@dataclass(frozen=True)
class NotServed:
    """A model id of the original OmniRT that this build does not serve, and what to use instead."""

    id: str
    # Why it is not served here (its own runtime, a pipeline no family of ours runs, ...).
    reason: str
    # The served model that comes closest ("" when nothing here does that task).
    closest: str = ""

    def error(self) -> ModelNotFound:
        """NOT_FOUND for a request naming this id: the reason, and the closest model here."""
        instead = f"; the closest here is {self.closest!r}" if self.closest else ""
        return ModelNotFound(
            f"model {self.id!r} is an id of the original OmniRT that this build does not serve: "
            f"{self.reason}{instead} (see docs/migrating.md)",
            field="model",
        )


def load_not_served(path: str | Path) -> list[NotServed]:
    """Read the `[[original_not_served]]` tables of one built-in catalog file."""
    path = Path(path)
    rows = []
    for entry in _read(path).get(NOT_SERVED_TABLE, []):
        where = f"{path}: [[{NOT_SERVED_TABLE}]] {echo(str(entry.get('id', '')))}"
        if not (entry.get("id") and entry.get("reason")):
            raise CatalogError(f"{where}: needs an `id` and a `reason`")
        row = _table(NotServed, entry, where)
        if not all(isinstance(getattr(row, f.name), str) for f in fields(NotServed)):
            raise CatalogError(f"{where}: `id`, `reason` and `closest` are strings")
        rows.append(row)
    return rows


class Catalog:
    """Models by id and alias. Later files replace entries of the same id."""

    def __init__(
        self,
        specs: Iterable[ModelSpec] = (),
        families: Iterable[Family] | None = None,
        not_served: Iterable[NotServed] = (),
    ) -> None:
        self._by_id: dict[str, ModelSpec] = {}
        self._alias: dict[str, str] = {}
        # Looked up only after the served ids and aliases: a user's entry of that id serves it.
        self._not_served = {row.id: row for row in not_served}
        self._families = dict(family_table.builtin()) if families is None else {}
        for family in families or ():
            self._families[family.id] = family
        for spec in specs:
            self.add(spec)

    @classmethod
    def load(cls, extra_files: Iterable[str | Path] = ()) -> Catalog:
        """The built-in catalog plus the user's files (their families first, then their models)."""
        specs: list[ModelSpec] = []
        not_served: list[NotServed] = []
        for name in BUILTIN_FILES:
            with resources.as_file(resources.files("omnirt.controller.core") / name) as path:
                specs += load_file(path)
                not_served += load_not_served(path)
        families = list(family_table.builtin().values())
        for extra in extra_files:
            families += load_families(extra)
            specs += load_file(extra)
        catalog = cls(specs, families, not_served)
        for row in not_served:
            if row.closest and not catalog.serves(row.closest):
                where = f"[[{NOT_SERVED_TABLE}]] {row.id!r}"
                raise CatalogError(f"{where}: closest {row.closest!r} is no catalog model")
        return catalog

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

    def serves(self, name: str) -> bool:
        """Whether `name` is the id or an alias of a model of this catalog."""
        return name in self._by_id or name in self._alias

    def resolve(self, name: str) -> ModelSpec:
        """The spec for an id or alias; ModelNotFound with close matches otherwise, or, for an id
        of the original OmniRT that this build does not serve, with why and the closest model."""
        if not name:
            raise InvalidRequest("model: required", field="model")
        # Before the lookup and the close matches (difflib is quadratic in the name's length).
        check_length("model", name, MAX_MODEL_NAME_CHARS)
        spec = self._by_id.get(name) or self._by_id.get(self._alias.get(name, ""))
        if spec is None and name in self._not_served:
            raise self._not_served[name].error()
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
