"""Step caching for one pipeline call through diffusers' cache hooks (`runtime.step_cache`).

Transformer denoisers that are a `CacheMixin` (Wan, Flux, CogVideoX, ...) reuse work across
denoising steps: `first_block` (skip the remaining blocks while the first block's residual
barely changes; `threshold`), `pyramid_attention_broadcast` (reuse attention outputs every
N-th step within a timestep range) and `faster_cache`. The hooks are registered with
`enable_cache(config)` right before the call and removed with `disable_cache()` right after,
so the cached pipeline's resting state has no cache: the caller holds the pipeline exclusively
meanwhile (the hooks sit on shared modules and keep per-call state).

How much was reused is counted: every attention module of the denoiser that really computes
calls its query projection (`to_q`) once per denoiser forward; the count of those that did not
is reported as `cache_hits["step_cache"]`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from omnirt.worker.failures import JobFailure, StopRun
from omnirt.worker.runtime.options import Effective, denoiser, denoisers

NAME = "step_cache"
CONFIG_CLASSES = {
    "first_block": "FirstBlockCacheConfig",
    "pyramid_attention_broadcast": "PyramidAttentionBroadcastConfig",
    "faster_cache": "FasterCacheConfig",
    "mag_cache": "MagCacheConfig",
    "taylor_seer": "TaylorSeerCacheConfig",
}
# Kinds that ask the pipeline for the current timestep.
NEEDS_TIMESTEP = frozenset({"pyramid_attention_broadcast", "faster_cache"})


@dataclass
class Usage:
    """Attention computations of one call: how many ran, and how many would have without the cache."""

    computed: int = 0
    forwards: int = 0
    attentions: int = 0

    @property
    def reused(self) -> int:
        return max(0, self.forwards * self.attentions - self.computed)


def check(pipeline: Any, options: Effective) -> None:
    """Refuse a step cache the pipeline cannot take (JobFailure naming the option)."""
    settings = options.call().get(NAME)
    if not settings:
        return
    from diffusers.models.cache_utils import CacheMixin

    module = denoiser(pipeline)
    if not isinstance(module, CacheMixin):
        what = type(module).__name__ if module is not None else "no denoiser"
        reason = f"{type(pipeline).__name__} has {what}, which does not support diffusers cache hooks"
        raise options.failure(NAME, reason + " (transformer models such as Wan do)")
    if settings["kind"] in NEEDS_TIMESTEP and not hasattr(type(pipeline), "current_timestep"):
        raise options.failure(NAME, f"{settings['kind']} needs a pipeline that exposes current_timestep")
    if (
        settings["kind"] == "taylor_seer"
        and not settings.get("use_lite_mode")
        and not _taylor_seer_hooks(module)
    ):
        reason = (
            f"taylor_seer's attention patterns match no module of {type(module).__name__} "
            "(they fit Flux-style block names); use_lite_mode = true caches its output projection"
        )
        raise options.failure(NAME, reason)
    if settings["kind"] == "mag_cache" and not settings.get("mag_ratios") and not mag_ratios(module):
        reason = (
            f"mag_cache needs mag_ratios calibrated for {type(module).__name__} (diffusers ships them "
            "for Flux only; calibrate them with diffusers' MagCacheConfig(calibrate=True))"
        )
        raise options.failure(NAME, reason)


def _taylor_seer_hooks(module: Any) -> bool:
    """Whether TaylorSeer's default attention patterns match a module of `module` (it hooks those)."""
    import re

    from diffusers.hooks import taylorseer_cache

    patterns = getattr(taylorseer_cache, "_TRANSFORMER_BLOCK_IDENTIFIERS", ())
    return any(re.fullmatch(p, name) for name, _ in module.named_modules() for p in patterns)


def config(view: Any, settings: Mapping[str, Any], steps: int = 0, module: Any = None) -> Any:
    """The diffusers config object for `settings` (`kind` plus its fields) on a call of `steps`."""
    import diffusers

    kind = settings["kind"]
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k != "kind"}
    if kind in NEEDS_TIMESTEP:
        # The per-call copy runs the loop, so it is the one that knows the current timestep.
        fields["current_timestep_callback"] = lambda: view.current_timestep
    if kind == "mag_cache":
        fields["num_inference_steps"] = steps or 28
        fields["mag_ratios"] = list(fields.get("mag_ratios") or mag_ratios(module))
    if kind == "taylor_seer":
        fields["taylor_factors_dtype"] = getattr(module, "dtype", None)
    return getattr(diffusers, CONFIG_CLASSES[kind])(**fields)


def mag_ratios(module: Any) -> list[float]:
    """The magnitude ratios diffusers ships for `module`'s model (Flux's only), else none."""
    if type(module).__name__ != "FluxTransformer2DModel":
        return []
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    return [float(r) for r in FLUX_MAG_RATIOS.tolist()]


@contextlib.contextmanager
def enabled(view: Any, options: Effective, steps: int = 0) -> Iterator[Usage | None]:
    """Run the body with `options`' step cache on `view`'s denoiser (None: no step cache asked).

    A failure of the call while the cache is on becomes a JobFailure naming the option: cache
    hooks fit only some models (faster_cache, for instance, expects batched guidance).
    """
    settings = options.call().get(NAME)
    if not settings:
        yield None
        return
    # Every denoiser: a two-expert model (Wan 2.2 A14B) caches in both experts.
    modules = denoisers(view)
    module = modules[0]
    usage = Usage()
    handles = []
    cached: list[Any] = []  # the denoisers hooked (or half hooked): undone after the call, whatever happens

    def count_forward(*_: Any) -> None:
        usage.forwards += 1

    def count_attention(*_: Any) -> None:
        usage.computed += 1

    try:
        for each in modules:
            projections = [m.to_q for m in each.modules() if hasattr(m, "to_q")]
            usage.attentions = max(usage.attentions, len(projections))
            handles.append(each.register_forward_pre_hook(count_forward))
            handles += [p.register_forward_pre_hook(count_attention) for p in projections]
            # diffusers raises here for a block class its hooks do not know (SkyReels-V2's with
            # first_block) or a transformer of one block: the option's fault, not an INTERNAL.
            cache_config = config(view, settings, steps, each)
            cached.append(each)
            try:
                each.enable_cache(cache_config)
            except Exception:
                each._cache_config = cache_config  # so disable_cache removes what was hooked so far
                raise
        yield usage
    except (StopRun, JobFailure):
        raise
    except Exception as exc:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        reason = f"the call failed with the {settings['kind']} cache on {type(module).__name__}: {text}"
        raise options.failure(NAME, reason) from exc
    finally:
        for each in cached:
            if each._cache_config is not None:
                each.disable_cache()
        for handle in handles:
            handle.remove()
