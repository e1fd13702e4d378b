"""The runtime options a model (catalog `runtime` table) or a request (`extra["runtime"]`) may set.

Pure Python, no torch: the controller validates requests with it, the worker parses the
catalog table and re-checks requests with the same code, so both agree on names and types.

Each option has a phase. *Load* options (`torch_compile`, `cpu_offload`, `layerwise_casting`,
`quantization`) change the loaded weights or modules: another value is another model cache
entry. *Call* options (`enable_vae_slicing`, `enable_vae_tiling`, `step_cache`, `inference_mode`,
`preview`) are set for one pipeline call and undone after it, on the already loaded pipeline.

Values are normalized (`true` -> `"inductor"` for `torch_compile`, a string shorthand -> a
table for `step_cache` and `quantization`), so equal settings compare equal (batching keys,
cache keys). `RuntimeOptionError.path` names the offending option (`step_cache.threshold`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

LOAD = "load"
CALL = "call"

OFFLOAD_MODES = ("model", "sequential")
# Storage dtypes of diffusers' layerwise casting (weights kept in these, upcast per layer).
CASTING_DTYPES = ("float8_e4m3fn", "float8_e5m2", "bfloat16", "float16")
QUANTIZATION_BACKENDS = ("torchao",)
# torchao configs by method name (the names users know from torchao's docs, snake_case).
QUANTIZATION_METHODS = (
    "int8_weight_only",
    "int8_dynamic_activation_int8_weight",
    "float8_weight_only",
    "int4_weight_only",
)

_INT = "int"
_FLOAT = "float"
_BOOL = "bool"
_RANGE = "range"  # [low, high] timesteps
_RATIOS = "ratios"  # a list of positive numbers (MagCache's calibrated magnitude ratios)
_STEP = "step"  # a step index, 0 allowed
# diffusers cache hook configs by kind, with the fields a user may set (the others are
# callbacks or module name patterns, chosen by OmniRT or diffusers).
STEP_CACHE_KINDS: dict[str, dict[str, str]] = {
    "first_block": {"threshold": _FLOAT},
    "pyramid_attention_broadcast": {
        "spatial_attention_block_skip_range": _INT,
        "temporal_attention_block_skip_range": _INT,
        "cross_attention_block_skip_range": _INT,
        "spatial_attention_timestep_skip_range": _RANGE,
        "temporal_attention_timestep_skip_range": _RANGE,
        "cross_attention_timestep_skip_range": _RANGE,
    },
    "faster_cache": {
        "spatial_attention_block_skip_range": _INT,
        "temporal_attention_block_skip_range": _INT,
        "spatial_attention_timestep_skip_range": _RANGE,
        "temporal_attention_timestep_skip_range": _RANGE,
        "low_frequency_weight_update_timestep_range": _RANGE,
        "high_frequency_weight_update_timestep_range": _RANGE,
        "alpha_low_frequency": _FLOAT,
        "alpha_high_frequency": _FLOAT,
        "unconditional_batch_skip_range": _INT,
        "unconditional_batch_timestep_skip_range": _RANGE,
        "is_guidance_distilled": _BOOL,
    },
    # Skip the blocks while the accumulated magnitude error of the residual stays under
    # `threshold`; `mag_ratios` are calibrated per checkpoint (diffusers ships Flux's, used for
    # a Flux transformer when none are given), interpolated to the request's steps.
    "mag_cache": {
        "threshold": _FLOAT,
        "max_skip_steps": _INT,
        "retention_ratio": _FLOAT,
        "mag_ratios": _RATIOS,
    },
    # Predict skipped steps' features with a Taylor expansion of the cached ones.
    "taylor_seer": {
        "cache_interval": _INT,
        "disable_cache_before_step": _STEP,
        "disable_cache_after_step": _STEP,
        "max_order": _INT,
        "use_lite_mode": _BOOL,
    },
}
# Pyramid attention broadcast does nothing unless a skip range is set: reuse every other one.
STEP_CACHE_DEFAULTS: dict[str, dict[str, Any]] = {
    "pyramid_attention_broadcast": {"spatial_attention_block_skip_range": 2},
}


class RuntimeOptionError(ValueError):
    """A runtime option has a bad value; `path` names it relative to the table (`step_cache.kind`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise RuntimeOptionError(path, f"must be true or false, not {value!r}")
    return value


def _int(value: Any, path: str, minimum: int = 1) -> int:
    # A google.protobuf.Struct carries every number as a double: 2.0 is the integer 2.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeOptionError(path, f"must be an integer, not {value!r}")
    if value < minimum:
        raise RuntimeOptionError(path, f"must be at least {minimum}, not {value}")
    return value


def _float(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise RuntimeOptionError(path, f"must be a number, not {value!r}")
    if value < 0:
        raise RuntimeOptionError(path, f"must not be negative, not {value}")
    return float(value)


def _range(value: Any, path: str) -> list[int]:
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise RuntimeOptionError(path, f"must be a [low, high] pair of timesteps, not {value!r}")
    low, high = (_int(v, path, minimum=-1) for v in value)
    if low > high:
        raise RuntimeOptionError(path, f"low must not exceed high, not {value!r}")
    return [low, high]


def _ratios(value: Any, path: str) -> list[float]:
    if not isinstance(value, list | tuple) or not 2 <= len(value) <= MAX_RATIOS:
        raise RuntimeOptionError(path, f"must be a list of 2 to {MAX_RATIOS} numbers, not {value!r}")
    ratios = [_float(v, path) for v in value]
    if not all(r > 0 for r in ratios):
        raise RuntimeOptionError(path, "every ratio must be positive")
    return ratios


def _step(value: Any, path: str) -> int:
    return _int(value, path, minimum=0)


# Most entries of `mag_ratios` (one per calibrated step).
MAX_RATIOS = 1000

_FIELD_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    _INT: _int,
    _FLOAT: _float,
    _BOOL: _bool,
    _RANGE: _range,
    _RATIOS: _ratios,
    _STEP: _step,
}


def _choice(value: Any, path: str, choices: tuple[str, ...], what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise RuntimeOptionError(path, f"{value!r} is not a known {what} (known: {', '.join(choices)})")
    return value


def _torch_compile(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "inductor" if value else ""
    if value == "":
        return ""
    if not isinstance(value, str) or not value.strip():
        raise RuntimeOptionError(path, f"must be true, false or a torch.compile backend name, not {value!r}")
    return value.strip()  # whether torch knows the backend is checked by the worker


def _cpu_offload(value: Any, path: str) -> str:
    if isinstance(value, bool):
        return "model" if value else ""
    if value == "":
        return ""
    if value not in OFFLOAD_MODES:
        raise RuntimeOptionError(path, f"must be true, false, 'model' or 'sequential', not {value!r}")
    return str(value)


def _layerwise_casting(value: Any, path: str) -> str:
    if value is False or value == "":
        return ""
    return _choice(value, path, CASTING_DTYPES, "storage dtype")


def _table(value: Any, path: str, key: str) -> dict[str, Any]:
    """A string shorthand (`"first_block"`) or a table with `key`; {} for false/empty (off)."""
    if value is False or value == "" or value is None:
        return {}
    if isinstance(value, str):
        return {key: value}
    if not isinstance(value, Mapping):
        raise RuntimeOptionError(path, f"must be a name or a table with {key!r}, not {value!r}")
    return dict(value)


def _quantization(value: Any, path: str) -> dict[str, Any]:
    table = _table(value, path, "method")
    if not table:
        return {}
    unknown = sorted(set(table) - {"backend", "method"})
    if unknown:
        raise RuntimeOptionError(f"{path}.{unknown[0]}", "unknown setting (known: backend, method)")
    backend = _choice(table.get("backend", "torchao"), f"{path}.backend", QUANTIZATION_BACKENDS, "backend")
    method = _choice(table.get("method"), f"{path}.method", QUANTIZATION_METHODS, f"{backend} method")
    return {"backend": backend, "method": method}


def _step_cache(value: Any, path: str) -> dict[str, Any]:
    table = _table(value, path, "kind")
    if not table:
        return {}
    kind = _choice(table.pop("kind", None), f"{path}.kind", tuple(STEP_CACHE_KINDS), "step cache kind")
    fields = STEP_CACHE_KINDS[kind]
    settings: dict[str, Any] = {"kind": kind, **STEP_CACHE_DEFAULTS.get(kind, {})}
    for name, raw in sorted(table.items()):
        if name not in fields:
            known = ", ".join(sorted(fields))
            raise RuntimeOptionError(f"{path}.{name}", f"unknown setting for {kind} (known: {known})")
        settings[name] = _FIELD_PARSERS[fields[name]](raw, f"{path}.{name}")
    return settings


PREVIEW_FORMATS = ("jpeg", "webp")
# `preview = true` and a table without `every_steps`: a preview every 5 steps (the measured cost
# on tiny-sd is in docs/BENCHMARKS.md), at most 256 px on the longer side.
PREVIEW_DEFAULTS: dict[str, Any] = {"every_steps": 5, "format": "jpeg", "max_size": 256}
PREVIEW_STEPS = (1, 1000)
PREVIEW_SIZES = (16, 1024)


def _bounded(value: Any, path: str, bounds: tuple[int, int]) -> int:
    number = _int(value, path, minimum=-(2**63))
    if not bounds[0] <= number <= bounds[1]:
        raise RuntimeOptionError(path, f"must be from {bounds[0]} to {bounds[1]}, not {number}")
    return number


def _preview(value: Any, path: str) -> dict[str, Any]:
    """`true`, a step interval (`5`) or `{every_steps, format, max_size}`; {} for false (off).

    An empty table is off too: it is the normalized form of `false`, which the worker parses again.
    """
    if value is False or value is None or (isinstance(value, Mapping) and not value):
        return {}
    if value is True:
        return dict(PREVIEW_DEFAULTS)
    if not isinstance(value, Mapping):
        return {**PREVIEW_DEFAULTS, "every_steps": _bounded(value, path, PREVIEW_STEPS)}
    unknown = sorted(set(value) - set(PREVIEW_DEFAULTS))
    if unknown:
        known = ", ".join(PREVIEW_DEFAULTS)
        raise RuntimeOptionError(f"{path}.{unknown[0]}", f"unknown setting (known: {known})")
    table = {**PREVIEW_DEFAULTS, **value}
    return {
        "every_steps": _bounded(table["every_steps"], f"{path}.every_steps", PREVIEW_STEPS),
        "format": _choice(table["format"], f"{path}.format", PREVIEW_FORMATS, "preview format"),
        "max_size": _bounded(table["max_size"], f"{path}.max_size", PREVIEW_SIZES),
    }


@dataclass(frozen=True)
class Option:
    """One runtime option: its phase and its parser (raw value -> normalized; falsy = off)."""

    name: str
    phase: str
    parse: Callable[[Any, str], Any]


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("enable_vae_slicing", CALL, _bool),
        Option("enable_vae_tiling", CALL, _bool),
        Option("step_cache", CALL, _step_cache),
        Option("inference_mode", CALL, _bool),
        Option("preview", CALL, _preview),
        Option("torch_compile", LOAD, _torch_compile),
        Option("cpu_offload", LOAD, _cpu_offload),
        Option("layerwise_casting", LOAD, _layerwise_casting),
        Option("quantization", LOAD, _quantization),
    )
}
LOAD_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.phase == LOAD)
CALL_OPTIONS = tuple(n for n, o in OPTIONS.items() if o.phase == CALL)
# The catalog key listing the options a request may set (default: all of them).
REQUEST_OPTIONS_KEY = "request_options"


def parse(runtime: Mapping[str, Any] | None, *, strict: bool = False) -> dict[str, Any]:
    """The normalized runtime options found in `runtime`.

    `strict` (a request's `extra.runtime`): any other key is an error. Otherwise (a catalog
    `runtime` table, which also holds `dtype`, `adapters`, `command`, ...) other keys are skipped.
    """
    options: dict[str, Any] = {}
    for name, value in (runtime or {}).items():
        option = OPTIONS.get(name)
        if option is None:
            if strict:
                raise RuntimeOptionError(name, f"unknown runtime option (known: {', '.join(OPTIONS)})")
            continue
        options[name] = option.parse(value, name)
    return options


def request_options(raw: Any, model_runtime: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate a request's `extra["runtime"]` against the model's `runtime.request_options`."""
    if not isinstance(raw, Mapping):
        raise RuntimeOptionError("", f"must be an object of runtime options, not {raw!r}")
    options = parse(raw, strict=True)
    allowed = (model_runtime or {}).get(REQUEST_OPTIONS_KEY)
    if allowed is not None:
        names = [str(n) for n in allowed] if isinstance(allowed, list | tuple) else []
        for name in options:
            if name not in names:
                listed = ", ".join(names) or "none"
                raise RuntimeOptionError(name, f"this model does not take it per request (allowed: {listed})")
    return options


def is_on(value: Any) -> bool:
    """Whether a normalized value turns its option on (`false`, `""` and `{}` are off)."""
    return bool(value)
