"""A request's defaults and seeds, once.

The controller's validation fills them in before a job is queued; the worker fills them in again
when it plans a run, so that a request reaching an executor without them (an executor's unit
test) runs as it would have through the controller. On a validated request the second pass
changes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from omnirt.types import GenerateRequest, ModelSpec, Task

# Request fields a preset (or the model's defaults) may fill in.
PRESET_FIELDS = (
    "width",
    "height",
    "num_frames",
    "fps",
    "num_inference_steps",
    "guidance_scale",
    "scheduler",
    "num_outputs",
    "strength",
    "duration_ms",
)
# Tasks that take `strength` (how far to move from the input image).
STRENGTH_TASKS = frozenset({Task.IMAGE2IMAGE, Task.INPAINT})
# Output i of a request is made with seed + i; the seed a request may ask for leaves room for
# the index within int64 (the seed's type on the wire).
MAX_SEED = 2**63 - 1 - 1024
# A seed chosen for a request that left it unset is below this.
RANDOM_SEED_BOUND = 2**31


def task_of(request: GenerateRequest, spec: ModelSpec) -> Task:
    """The request's task, else the model's first (text2image for a spec that lists none)."""
    return request.task or (spec.tasks[0] if spec.tasks else Task.TEXT2IMAGE)


def apply(req: GenerateRequest, spec: ModelSpec, overrides: Mapping[str, Any] | None = None) -> None:
    """Fill, in place, each field of `req` left unset (None, or "" for the scheduler).

    A preset's `overrides` come first, then the model's defaults (a 0 there means none);
    `strength` only for the tasks that take an input image (`req.task`, or the model's first
    task). One output when neither says; a random seed when the request gave none.
    """
    overrides = overrides or {}
    task = task_of(req, spec)
    for name in PRESET_FIELDS:
        if getattr(req, name) not in (None, ""):
            continue
        if name == "strength" and task not in STRENGTH_TASKS:
            continue  # a model's default strength is for its image-input tasks only
        value = overrides.get(name) or getattr(spec.defaults, name, None)
        if value:
            setattr(req, name, value)
    if req.num_outputs is None:
        req.num_outputs = 1
    if req.seed is None:
        req.seed = random_seed()


def random_seed() -> int:
    """A seed for a request that left it unset (reported with its results, so they can be made again)."""
    return secrets.randbelow(RANDOM_SEED_BOUND)


def output_seeds(seed: int, num_outputs: int) -> list[int]:
    """The seed of each output of a request: `seed`, `seed + 1`, ..."""
    return [seed + i for i in range(num_outputs)]


def planned_steps(request: GenerateRequest) -> int:
    """The denoising steps a request runs, as diffusers' image-to-image pipelines count them.

    Of `num_inference_steps`, `int(steps * strength)` for the tasks that take a strength (so 0.75
    of one step is none); the worker's progress has the last word.
    """
    steps = request.num_inference_steps or 0
    strength = request.strength
    if strength is not None and 0 < strength < 1 and request.task in STRENGTH_TASKS:
        return min(int(steps * strength), steps)
    return steps
