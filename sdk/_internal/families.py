"""Model families: what each family's pipelines take (`families.toml`), for controller and worker.

Pure Python, no torch. The controller refuses, at validation, a request its model's family cannot
honour (a size off the family's grid, a frame count off its temporal grid, a field none of its
pipelines takes, an input role its task's pipeline has no argument for, an execution mode it
cannot run in); the worker reads which pipelines round frame counts themselves. Catalog files
may add or replace families with `[[families]]` tables of the same keys.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from importlib import resources
from typing import Any

from omnirt._internal.modes import EXECUTION_MODES
from omnirt.types import MediaRole, Task

# Request fields a family may declare it cannot honour.
# The last three: a model that runs no diffusion (a transformers TTS model) takes none of them.
REFUSABLE_FIELDS = (
    "prompt",
    "negative_prompt",
    "guidance_scale",
    "num_frames",
    "duration_ms",
    "num_inference_steps",
    "width",
    "height",
)
PARALLEL_KINDS = ("cfg", "data", "none", "ulysses", "ring")
OFFLOAD_AIDS = ("cpu_offload", "vae_tiling", "vae_slicing")
DTYPES = ("float16", "bfloat16", "float32")
BACKENDS = ("cuda", "ascend")


class FamilyError(ValueError):
    """A family table is malformed; the message names the file and the family."""


@dataclass(frozen=True)
class Family:
    """One `[[families]]` table."""

    id: str
    description: str = ""
    pipelines: Mapping[Task, str] = field(default_factory=dict)
    size_multiple: int = 8
    frame_grid: int = 0
    rounds_frames: bool = False
    unsupported: tuple[str, ...] = ()
    inputs: Mapping[Task, tuple[MediaRole, ...]] = field(default_factory=dict)
    modes: tuple[str, ...] = ("legacy_call",)
    parallel: tuple[str, ...] = ()
    dtype: Mapping[str, str] = field(default_factory=dict)
    offload: tuple[str, ...] = ()
    step_cache: bool = False
    modular: tuple[Task, ...] = ()
    min_steps: int = 1

    @property
    def tasks(self) -> tuple[Task, ...]:
        return tuple(self.pipelines)

    def on_frame_grid(self, num_frames: int) -> bool:
        """Whether `num_frames` is k*n+1 for the family's grid k (always, with no grid)."""
        return not self.frame_grid or self.rounds_frames or num_frames % self.frame_grid == 1


def _strings(value: Any, where: str, allowed: Iterable[str] | None = None) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FamilyError(f"{where}: must be a list of strings")
    if allowed is not None:
        allowed = tuple(allowed)
        for v in value:
            if v not in allowed:
                raise FamilyError(f"{where}: {v!r} is not one of {list(allowed)}")
    return tuple(value)


def _task(name: str, where: str) -> Task:
    try:
        return Task(name)
    except ValueError:
        raise FamilyError(f"{where}: {name!r} is not a task ({[t.value for t in Task]})") from None


def family_from_dict(entry: Mapping[str, Any], where: str) -> Family:
    """Build a Family from one `[[families]]` table; FamilyError naming the key otherwise."""
    data = dict(entry)
    family_id = data.get("id")
    if not isinstance(family_id, str) or not family_id:
        raise FamilyError(f"{where}: every family needs a string `id`")
    where = f"{where}: family {family_id!r}"
    known = {f.name for f in fields(Family)}
    unknown = set(data) - known
    if unknown:
        raise FamilyError(f"{where}: unknown keys {sorted(unknown)} (known: {sorted(known)})")
    pipelines = data.get("pipelines", {})
    if not isinstance(pipelines, dict) or not pipelines:
        raise FamilyError(f"{where}: `pipelines` must map at least one task to a pipeline class")
    data["pipelines"] = {_task(k, f"{where} pipelines"): str(v) for k, v in pipelines.items()}
    inputs = data.get("inputs", {})
    if not isinstance(inputs, dict):
        raise FamilyError(f"{where}: `inputs` must map tasks to lists of input roles")
    data["inputs"] = {
        _task(k, f"{where} inputs"): tuple(
            MediaRole(r) for r in _strings(v, f"{where} inputs.{k}", [m.value for m in MediaRole])
        )
        for k, v in inputs.items()
    }
    modular = data.get("modular", [])
    data["modular"] = tuple(_task(x, f"{where} modular") for x in _strings(modular, f"{where} modular"))
    if not set(data["modular"]) <= set(data["pipelines"]):
        raise FamilyError(f"{where}: `modular` lists a task `pipelines` has no class for")
    for key in ("size_multiple", "frame_grid", "min_steps"):
        value = data.get(key, {"size_multiple": 8, "min_steps": 1}.get(key, 0))
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1024:
            raise FamilyError(f"{where}: `{key}` must be a whole number from 0 to 1024")
    for key in ("size_multiple", "min_steps"):
        if data.get(key) == 0:
            raise FamilyError(f"{where}: `{key}` must be at least 1")
    for key in ("rounds_frames", "step_cache"):
        if not isinstance(data.get(key, False), bool):
            raise FamilyError(f"{where}: `{key}` must be true or false")
    lists = {
        "unsupported": REFUSABLE_FIELDS,
        "modes": EXECUTION_MODES,
        "parallel": PARALLEL_KINDS,
        "offload": OFFLOAD_AIDS,
    }
    for key, allowed in lists.items():
        if key in data:
            data[key] = _strings(data[key], f"{where} {key}", allowed)
    dtype = data.get("dtype", {})
    if not isinstance(dtype, dict) or any(b not in BACKENDS or d not in DTYPES for b, d in dtype.items()):
        raise FamilyError(f"{where}: `dtype` maps backends {list(BACKENDS)} to dtypes {list(DTYPES)}")
    return Family(**data)


def load(text: str, where: str) -> list[Family]:
    """The families of one TOML document."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FamilyError(f"{where}: {exc}") from None
    return [family_from_dict(entry, where) for entry in data.get("families", [])]


@functools.cache
def builtin() -> dict[str, Family]:
    """The built-in families by id."""
    text = (resources.files("omnirt._internal") / "families.toml").read_text()
    return {f.id: f for f in load(text, "families.toml")}


@functools.cache
def rounding_pipelines() -> frozenset[str]:
    """Pipeline classes of the built-in families that round a frame count themselves."""
    return frozenset(cls for f in builtin().values() if f.rounds_frames for cls in f.pipelines.values())
