"""Each pipeline call's own scheduler: a copy of a pristine one made from the pipeline's config.

Schedulers keep per-call state (timesteps, step index, DPM-Solver's model outputs) and several
slots may run the same cached pipeline at once, so every call (legacy_call's pipeline call,
modular's pass through the stages) gets a scheduler of its own; the weights stay shared.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from omnirt.worker.pipelines.args import scheduler_class

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
