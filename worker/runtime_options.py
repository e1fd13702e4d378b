"""Load-time runtime options of a model (its catalog `runtime` table), applied once per load.

- `enable_vae_slicing` / `enable_vae_tiling` (bool): decode the batch one image at a time /
  in tiles (less peak memory, same images up to rounding).
- `torch_compile` (bool, or a torch.compile backend name such as "inductor" or "eager"):
  compile the denoiser (UNet or transformer) with `Module.compile(backend=...)`.
  Compilation happens at the first call; if that call fails, the compiled code is dropped,
  the call runs again eagerly and the reason goes to the report's warnings (from then on).
- `cpu_offload` (bool or "model" / "sequential"): diffusers' model / sequential CPU offload
  instead of moving the pipeline to the accelerator. Ignored with a warning on the cpu backend.

The options are part of the model cache key (two entries with different options are two
pipelines). What was applied is kept on the pipeline object and reported in
`config_resolved["runtime_options"]`; notes (offload ignored, compile fell back) in warnings.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from omnirt.worker.backends import BackendError, Placement

log = logging.getLogger(__name__)

OFFLOAD_MODES = ("", "model", "sequential")
DENOISERS = ("unet", "transformer")


@dataclass(frozen=True)
class LoadOptions:
    """The load-time options of one model, validated."""

    enable_vae_slicing: bool = False
    enable_vae_tiling: bool = False
    # "" = off; else the torch.compile backend ("inductor" for `true`).
    torch_compile: str = ""
    cpu_offload: str = ""

    def key(self) -> str:
        """A stable string for the model cache key ("" when every option is off)."""
        return "" if self == LoadOptions() else json.dumps(asdict(self), sort_keys=True)


def _flag(runtime: Mapping[str, Any], name: str) -> bool:
    value = runtime.get(name, False)
    if not isinstance(value, bool):
        raise BackendError(f"runtime.{name} must be true or false, not {value!r}")
    return value


def load_options(runtime: Mapping[str, Any] | None) -> LoadOptions:
    """The options of a model's `runtime` table; BackendError names a bad one."""
    runtime = runtime or {}
    offload = runtime.get("cpu_offload", "")
    if isinstance(offload, bool):
        offload = "model" if offload else ""
    if offload not in OFFLOAD_MODES:
        raise BackendError(
            f"runtime.cpu_offload must be true, false, 'model' or 'sequential', not {offload!r}"
        )
    compile_backend = runtime.get("torch_compile", False)
    if isinstance(compile_backend, bool):
        compile_backend = "inductor" if compile_backend else ""
    if not isinstance(compile_backend, str):
        raise BackendError(
            f"runtime.torch_compile must be true, false or a backend name, not {compile_backend!r}"
        )
    if compile_backend:
        import torch

        if compile_backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise BackendError(f"runtime.torch_compile: unknown torch.compile backend {compile_backend!r}")
    return LoadOptions(
        enable_vae_slicing=_flag(runtime, "enable_vae_slicing"),
        enable_vae_tiling=_flag(runtime, "enable_vae_tiling"),
        torch_compile=compile_backend,
        cpu_offload=str(offload),
    )


def _vae_call(pipeline: Any, option: str) -> bool:
    """`vae.enable_slicing()` for `enable_vae_slicing` (else the pipeline's own, older, method).

    False when neither exists (a pipeline without such a VAE).
    """
    vae = getattr(pipeline, "vae", None)
    for owner, method in ((vae, option.replace("enable_vae_", "enable_")), (pipeline, option)):
        if owner is not None and callable(getattr(owner, method, None)):
            getattr(owner, method)()
            return True
    return False


def apply(pipeline: Any, options: LoadOptions, placement: Placement) -> None:
    """Apply `options` to a freshly loaded pipeline and place it (`.to(device)` or offload)."""
    notes: list[str] = []
    applied: dict[str, Any] = {}
    if options.cpu_offload and placement.device == "cpu":
        notes.append("runtime.cpu_offload ignored: the model already runs on the cpu backend")
    elif options.cpu_offload:
        method = (
            "enable_model_cpu_offload" if options.cpu_offload == "model" else "enable_sequential_cpu_offload"
        )
        getattr(pipeline, method)(device=placement.device)
        applied["cpu_offload"] = options.cpu_offload
    if placement.device != "cpu" and not placement.device_map and "cpu_offload" not in applied:
        pipeline.to(placement.device)
    for name in ("enable_vae_slicing", "enable_vae_tiling"):
        if getattr(options, name):
            if _vae_call(pipeline, name):
                applied[name] = True
            else:
                notes.append(f"runtime.{name} ignored: {type(pipeline).__name__} has no VAE that supports it")
    if options.torch_compile:
        denoiser = next(
            (getattr(pipeline, n) for n in DENOISERS if getattr(pipeline, n, None) is not None), None
        )
        if denoiser is None:
            notes.append("runtime.torch_compile ignored: the pipeline has no unet or transformer")
        else:
            denoiser.compile(backend=options.torch_compile)
            applied["torch_compile"] = options.torch_compile
    pipeline._omnirt_options = applied
    pipeline._omnirt_notes = notes


def report(pipeline: Any) -> dict[str, Any]:
    """The options applied to `pipeline` (for `config_resolved["runtime_options"]`)."""
    return dict(getattr(pipeline, "_omnirt_options", {}))


def notes(pipeline: Any) -> list[str]:
    """Warnings about `pipeline`'s options (ignored ones, a compile that fell back)."""
    return list(getattr(pipeline, "_omnirt_notes", []))


def is_compiled(pipeline: Any) -> bool:
    """Whether the denoiser of `pipeline` still runs compiled."""
    return bool(report(pipeline).get("torch_compile"))


def drop_compile(pipeline: Any, exc: BaseException) -> None:
    """Run the denoiser eagerly from now on, and say why in the pipeline's notes."""
    for name in DENOISERS:
        module = getattr(pipeline, name, None)
        if module is not None:
            module._compiled_call_impl = None  # what Module.compile() set
    options = getattr(pipeline, "_omnirt_options", {})
    options.pop("torch_compile", None)
    reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    pipeline._omnirt_notes = [*notes(pipeline), f"torch_compile failed, running eagerly: {reason}"]
    log.warning("torch.compile failed, running eagerly: %s", reason)
