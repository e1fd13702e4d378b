"""Runtime options of a model (catalog `runtime` table) and of a request (`extra["runtime"]`).

Names, types and phases are in `omnirt._internal.runtime_schema` (shared with the controller);
a request's value overrides the model's. This module applies them:

- load options, once per load (`apply`, `load_kwargs`); they are part of the model cache key:
  - `torch_compile` (true or a torch.compile backend): compile the denoiser (UNet or
    transformer). If the first call fails, the compiled code is dropped, the call runs again
    eagerly and the reason goes to the report's warnings (from then on).
  - `cpu_offload` (true/"model" or "sequential"): diffusers' CPU offload instead of moving the
    pipeline to the accelerator; ignored with a warning on the cpu backend.
  - `layerwise_casting` (a storage dtype such as "float8_e4m3fn"): the denoiser's weights are
    stored in that dtype and upcast layer by layer to the compute dtype
    (`ModelMixin.enable_layerwise_casting`).
  - `quantization` (a torchao method): see `omnirt.worker.runtime.quantization`.
- call options, per pipeline call on the loaded pipeline (`call_vae`; `step_cache` in
  `omnirt.worker.runtime.step_cache`): nothing is reloaded and nothing outlives the call.

What was applied is reported in `config_resolved["runtime_options"]`; notes (an option
ignored, a compile that fell back) in the report's warnings.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from omnirt._internal import runtime_schema
from omnirt._internal.runtime_schema import RuntimeOptionError
from omnirt.worker.failures import JobFailure
from omnirt.worker.runtime import quantization
from omnirt.worker.runtime.backends import BackendError, Placement

log = logging.getLogger(__name__)

# transformer_2: the low-noise expert of two-expert models (Wan 2.2 A14B), treated like the first.
DENOISERS = ("unet", "transformer", "transformer_2")
MODEL_PREFIX = "runtime"
REQUEST_PREFIX = "extra.runtime"
REQUEST_KEY = "runtime"  # the key of `GenerateRequest.extra` that holds a request's options


@dataclass(frozen=True)
class LoadOptions:
    """The load-time options of one model entry, validated and normalized."""

    # "" = off; else the torch.compile backend ("inductor" for `true`).
    torch_compile: str = ""
    cpu_offload: str = ""
    # "" = off; else the storage dtype of the denoiser's weights.
    layerwise_casting: str = ""
    # {} = off; else {"backend": ..., "method": ...}.
    quantization: dict[str, str] = field(default_factory=dict)

    def key(self) -> str:
        """A stable string for the model cache key ("" when every option is off)."""
        return "" if self == LoadOptions() else json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> LoadOptions:
        """The load options among normalized `options`."""
        return cls(**{n: options[n] for n in runtime_schema.LOAD_OPTIONS if n in options})


@dataclass(frozen=True)
class Effective:
    """A job's options: the model's, overridden by its request's, and where each came from."""

    values: dict[str, Any] = field(default_factory=dict)
    from_request: frozenset[str] = frozenset()

    def load(self) -> LoadOptions:
        return LoadOptions.of(self.values)

    def call(self) -> dict[str, Any]:
        """The call options that are on."""
        return {n: self.values[n] for n in runtime_schema.CALL_OPTIONS if self.values.get(n)}

    def where(self, name: str) -> str:
        """The field that set `name`: `extra.runtime.NAME` or `runtime.NAME`."""
        return f"{REQUEST_PREFIX if name in self.from_request else MODEL_PREFIX}.{name}"

    def failure(self, name: str, reason: str) -> JobFailure:
        """INVALID_ARGUMENT when the request set `name`, FAILED_PRECONDITION when the catalog did."""
        code = "INVALID_ARGUMENT" if name in self.from_request else "FAILED_PRECONDITION"
        where = self.where(name)
        return JobFailure(code, f"{where}: {reason}", where)

    def group_key(self) -> str:
        """Jobs with different options never share a pipeline call."""
        return json.dumps(self.values, sort_keys=True)

    def runtime_for_load(self, model_runtime: Mapping[str, Any]) -> dict[str, Any]:
        """The model's `runtime` table with the request's load options laid over it (the cache key)."""
        request_load = {n: self.values[n] for n in self.from_request if n in runtime_schema.LOAD_OPTIONS}
        return {**model_runtime, **request_load}


def model_options(runtime: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options of a model's `runtime` table; BackendError naming `runtime.NAME` on a bad one."""
    try:
        return runtime_schema.parse(runtime)
    except RuntimeOptionError as exc:
        raise BackendError(f"{MODEL_PREFIX}.{exc}") from exc


def load_options(runtime: Mapping[str, Any] | None) -> LoadOptions:
    """The load options of a `runtime` table; BackendError names a bad one."""
    return LoadOptions.of(model_options(runtime))


def for_request(model_runtime: Mapping[str, Any], extra: Mapping[str, Any]) -> Effective:
    """A job's options; JobFailure(INVALID_ARGUMENT, `extra.runtime.NAME`) for a bad request value."""
    values = model_options(model_runtime)
    if REQUEST_KEY not in extra:
        return Effective(values)
    try:
        requested = runtime_schema.request_options(extra[REQUEST_KEY], model_runtime)
    except RuntimeOptionError as exc:
        where = f"{REQUEST_PREFIX}.{exc.path}" if exc.path else REQUEST_PREFIX
        raise JobFailure("INVALID_ARGUMENT", f"{where}: {exc.reason}", where) from exc
    return Effective({**values, **requested}, frozenset(requested))


def check_load(options: Effective, placement: Placement) -> None:
    """Refuse load options this worker cannot honour, before loading anything (JobFailure)."""
    load = options.load()
    if load.torch_compile:
        import torch

        if load.torch_compile not in torch._dynamo.list_backends(exclude_tags=()):
            raise options.failure("torch_compile", f"unknown torch.compile backend {load.torch_compile!r}")
    if load.quantization:
        if load.layerwise_casting:
            reason = "cannot be combined with layerwise_casting (both change how the denoiser stores weights)"
            raise options.failure("quantization", reason)
        problem = quantization.problem(load.quantization, placement.device)
        if problem:
            raise options.failure("quantization", problem)


def check_adapters(options: Effective, count: int) -> None:
    """Refuse LoRA adapters on a layerwise-cast denoiser (peft cannot scale float8-stored weights)."""
    if not count or not options.values.get("layerwise_casting"):
        return
    why = "peft cannot apply LoRA adapters to weights stored for layerwise casting"
    if "layerwise_casting" in options.from_request:
        raise options.failure("layerwise_casting", f"cannot be combined with adapters ({why})")
    reason = f"adapters[0]: this model sets runtime.layerwise_casting, and {why}"
    raise JobFailure("INVALID_ARGUMENT", reason, "adapters[0]")


def load_kwargs(options: LoadOptions, location: str) -> dict[str, Any]:
    """Extra `from_pretrained` arguments for `options` (the quantization config)."""
    if not options.quantization:
        return {}
    return {"quantization_config": quantization.pipeline_config(options.quantization, location)}


def denoiser(pipeline: Any) -> Any:
    """The pipeline's UNet or (first) transformer (None when it has neither)."""
    return next(iter(denoisers(pipeline)), None)


def denoisers(pipeline: Any) -> list[Any]:
    """Every denoiser of the pipeline: its UNet or transformer, and a second expert if it has one."""
    return [getattr(pipeline, n) for n in DENOISERS if getattr(pipeline, n, None) is not None]


def apply(pipeline: Any, options: LoadOptions, placement: Placement) -> None:
    """Apply load `options` to a freshly loaded pipeline and place it (`.to(device)` or offload)."""
    notes: list[str] = []
    applied: dict[str, Any] = {}
    module = denoiser(pipeline)
    if options.quantization:
        applied["quantization"] = dict(options.quantization)  # done by from_pretrained
    if options.layerwise_casting:
        if module is None or not hasattr(module, "enable_layerwise_casting"):
            raise BackendError("layerwise_casting: the pipeline has no diffusers unet or transformer to cast")
        for each in denoisers(pipeline):
            _cast_layerwise(each, options.layerwise_casting, placement, applied, notes)
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
    if options.torch_compile:
        if module is None:
            notes.append("runtime.torch_compile ignored: the pipeline has no unet or transformer")
        else:
            for each in denoisers(pipeline):
                each.compile(backend=options.torch_compile)
            applied["torch_compile"] = options.torch_compile
    pipeline._omnirt_options = applied
    pipeline._omnirt_notes = notes


def _cast_layerwise(
    module: Any, storage: str, placement: Placement, applied: dict[str, Any], notes: list[str]
) -> None:
    import torch

    storage_dtype, compute_dtype = getattr(torch, storage), placement.torch_dtype()
    if storage_dtype == compute_dtype:
        note = f"runtime.layerwise_casting ignored: the model already computes in {storage}"
        if note not in notes:  # once for a two-expert model
            notes.append(note)
        return
    module.enable_layerwise_casting(storage_dtype=storage_dtype, compute_dtype=compute_dtype)
    applied["layerwise_casting"] = {"storage_dtype": storage, "compute_dtype": placement.dtype}


def call_vae(view: Any, call: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Give `view` (a per-call copy of a pipeline) a VAE of its own with the asked slicing/tiling.

    The copy shares the weights; only its flags differ, so concurrent calls on the cached
    pipeline are not affected. Returns (options applied, notes about ignored ones).
    """
    wanted = [n for n in ("enable_vae_slicing", "enable_vae_tiling") if call.get(n)]
    if not wanted:
        return {}, []
    vae = getattr(view, "vae", None)
    methods = [n.replace("enable_vae_", "enable_") for n in wanted]  # vae.enable_slicing, ...
    if vae is None or not all(callable(getattr(vae, m, None)) for m in methods):
        names = ", ".join(wanted)
        return {}, [f"{names} ignored: {type(view).__name__} has no VAE that supports it"]
    own = copy.copy(vae)
    for method in methods:
        getattr(own, method)()
    view.vae = own
    return dict.fromkeys(wanted, True), []


def report(pipeline: Any) -> dict[str, Any]:
    """The load options applied to `pipeline` (for `config_resolved["runtime_options"]`)."""
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
