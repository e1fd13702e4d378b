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

from omnirt.worker.modes.base import JobFailure, StopRun
from omnirt.worker.runtime.options import Effective, denoiser

NAME = "step_cache"
CONFIG_CLASSES = {
    "first_block": "FirstBlockCacheConfig",
    "pyramid_attention_broadcast": "PyramidAttentionBroadcastConfig",
    "faster_cache": "FasterCacheConfig",
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


def config(view: Any, settings: Mapping[str, Any]) -> Any:
    """The diffusers config object for `settings` (`kind` plus its fields)."""
    import diffusers

    kind = settings["kind"]
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items() if k != "kind"}
    if kind in NEEDS_TIMESTEP:
        # The per-call copy runs the loop, so it is the one that knows the current timestep.
        fields["current_timestep_callback"] = lambda: view.current_timestep
    return getattr(diffusers, CONFIG_CLASSES[kind])(**fields)


@contextlib.contextmanager
def enabled(view: Any, options: Effective) -> Iterator[Usage | None]:
    """Run the body with `options`' step cache on `view`'s denoiser (None: no step cache asked).

    A failure of the call while the cache is on becomes a JobFailure naming the option: cache
    hooks fit only some models (faster_cache, for instance, expects batched guidance).
    """
    settings = options.call().get(NAME)
    if not settings:
        yield None
        return
    module = denoiser(view)
    usage = Usage()
    projections = [m.to_q for m in module.modules() if hasattr(m, "to_q")]
    usage.attentions = len(projections)

    def count_forward(*_: Any) -> None:
        usage.forwards += 1

    def count_attention(*_: Any) -> None:
        usage.computed += 1

    handles = [module.register_forward_pre_hook(count_forward)]
    handles += [p.register_forward_pre_hook(count_attention) for p in projections]
    module.enable_cache(config(view, settings))
    try:
        yield usage
    except (StopRun, JobFailure):
        raise
    except Exception as exc:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        reason = f"the call failed with the {settings['kind']} cache on {type(module).__name__}: {text}"
        raise options.failure(NAME, reason) from exc
    finally:
        module.disable_cache()
        for handle in handles:
            handle.remove()
