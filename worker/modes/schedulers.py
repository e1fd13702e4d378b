"""What a pipeline call must not share with another call of the same cached pipeline.

Several slots may run one cached pipeline at once (legacy_call's pipeline call, modular's pass
through the stages), each on a shallow copy of it (a view); the weights stay shared, but:

* schedulers keep per-call state (timesteps, step index, DPM-Solver's model outputs): every call
  gets a copy of a pristine one made from the pipeline's config (`fresh_scheduler`);
* a fast tokenizer (a `tokenizers` backend) keeps its padding and truncation between calls: a
  call sets them, then encodes, so two calls on one tokenizer may pad one prompt as the other
  asked (11 tokens against 77, and a job failed). Every call borrows tokenizers no other call
  uses (`own_tokenizers`): the pipeline's own when free, else a copy, kept for the next call.

The view itself (`call_view`) answers diffusers' `_execution_device` from the cached pipeline's
first answer: diffusers walks every module of every component to find offload hooks each time a
call asks (2.5 ms a call on tiny-sd's 432 modules, 14.9 ms on a real-size SDXL's 2,717), and a
loaded pipeline is placed once (the model cache never moves it; offload hooks are set at load).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from omnirt.worker.pipelines.args import scheduler_class

# A pipeline class -> its subclass whose `_execution_device` is the one the view carries.
_VIEW_CLASSES: dict[type, type] = {}
_DEVICE = "_omnirt_execution_device"


def call_view(pipeline: Any) -> Any:
    """A shallow copy of `pipeline` for one call (the weights shared), whose `_execution_device`
    is computed once per cached pipeline (see the module docstring)."""
    cls = type(pipeline)
    if not isinstance(getattr(cls, "_execution_device", None), property):
        return copy.copy(pipeline)
    if _DEVICE not in pipeline.__dict__:
        # Not diffusers' __setattr__: it would write the name into the pipeline's config.
        object.__setattr__(pipeline, _DEVICE, pipeline._execution_device)
    view = copy.copy(pipeline)
    view_class = _VIEW_CLASSES.get(cls)
    if view_class is None:
        attributes = {
            "_execution_device": property(lambda self: self.__dict__[_DEVICE]),
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
        }
        view_class = _VIEW_CLASSES.setdefault(cls, type(cls.__name__, (cls,), attributes))
    view.__class__ = view_class
    return view


# The pipeline's scheduler -> its pristine schedulers by class (dropped with the pipeline).
_SCHEDULER_TEMPLATES: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()


def fresh_scheduler(base: Any, name: str) -> tuple[Any, list[str]]:
    """A new scheduler from the pipeline's config: of class `name` when given, else the same class."""
    cls = scheduler_class(name) if name else type(base)
    warnings = []
    if cls is not type(base):  # `compatibles` imports each class it names: only when it matters
        compatibles = {c.__name__ for c in getattr(base, "compatibles", [])}
        if compatibles and cls.__name__ not in compatibles:
            warnings.append(f"scheduler {cls.__name__} is not listed as compatible with this pipeline")
    templates = _SCHEDULER_TEMPLATES.setdefault(base, {})
    template = templates.get(cls)
    if template is None:
        template = templates[cls] = cls.from_config(base.config)
    return scheduler_copy(template), warnings


# A pipeline's fast tokenizer -> the tokenizers of it no call holds now (itself first, then the
# copies made while it was busy: at most one per call that ran at once).
_FREE_TOKENIZERS: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()
_TOKENIZERS_LOCK = threading.Lock()


@contextlib.contextmanager
def own_tokenizers(view: Any) -> Iterator[None]:
    """While the block runs, `view`'s fast tokenizers are its alone (see the module docstring)."""
    components = getattr(view, "components", None) or {}
    lent: list[tuple[str, Any, Any]] = []
    for name, tokenizer in components.items():
        if not hasattr(tokenizer, "backend_tokenizer"):  # slow tokenizers keep no call state
            continue
        with _TOKENIZERS_LOCK:
            free = _FREE_TOKENIZERS.setdefault(tokenizer, [tokenizer])
            borrowed = free.pop() if free else None
        if borrowed is None:
            borrowed = copy.deepcopy(tokenizer)
        # Not diffusers' __setattr__: it would write the name into the config the view shares.
        object.__setattr__(view, name, borrowed)
        lent.append((name, tokenizer, borrowed))
    try:
        yield
    finally:
        with _TOKENIZERS_LOCK:
            for _, tokenizer, borrowed in lent:
                _FREE_TOKENIZERS.setdefault(tokenizer, []).append(borrowed)


def scheduler_copy(template: Any) -> Any:
    """A copy of a pristine scheduler that shares nothing a call changes, in a sixth of deepcopy's time.

    Its tensors and arrays are cloned and its lists, dicts and sets deep-copied (DPM-Solver keeps
    its model outputs in a list it fills in place); the frozen config and scalars are shared.
    """
    import numpy as np
    import torch
    from diffusers.configuration_utils import FrozenDict

    scheduler = copy.copy(template)
    state = scheduler.__dict__
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            state[name] = value.clone()
        elif isinstance(value, np.ndarray):
            state[name] = value.copy()
        elif isinstance(value, list | dict | set) and not isinstance(value, FrozenDict):
            state[name] = copy.deepcopy(value)
    return scheduler


def seed_noise_sampler(scheduler: Any, seeds: list[int]) -> None:
    """Make a stochastic-differential-equation scheduler reproducible from the request's seeds.

    DPM-Solver SDE draws its Brownian noise from a seed of its own, taken from torch's global RNG
    when unset: the same request would give other bytes each time. One seed per output (a tree
    each), so an output in a batch is the same as alone.
    """
    if getattr(scheduler, "noise_sampler_seed", 0) is None and seeds:
        scheduler.noise_sampler_seed = list(seeds) if len(seeds) > 1 else seeds[0]
