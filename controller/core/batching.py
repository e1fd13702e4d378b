"""The batch rule of the controller, once: which queued jobs share one pipeline call, how many,
and how long the first of them waits for companions; and which job may join a batch a worker's
step engine is running (`step_key`, `step_rows`, `may_join`).

Both engines decide with it: the memory engine in its dispatch, the Redis engine through its
CLAIM script, which keeps a copy of `window_due` in Lua because the decision must be atomic with
the claim inside Redis. tests/integration/test_batching_rule.py holds the two to the same answers.
Which request fields two jobs must share is `omnirt._internal.batching`, which the worker's
grouping reads too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable

from omnirt._internal import batching
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.original import BACKEND_LABEL
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.validation import Plan
from omnirt.types import ModelSpec, Task


def pinned_backend(plan: Plan) -> str:
    """The backend whose workers alone may run the job ("" = any): its `omnirt.backend` label."""
    return plan.request.labels.get(BACKEND_LABEL, "")


def queue_name(model: str, backend: str = "") -> str:
    """The queue a job waits in: its model's, or `model@backend` for a job pinned to a backend.

    Pinned jobs wait apart so that a controller takes from a queue only what its free workers can
    run (the Redis engine claims by queue; its job hash's `model` field holds this name). Model ids
    hold no `@` (the catalog's and the hub's ids are checked for it)."""
    return f"{model}@{backend}" if backend else model


def split_queue(name: str) -> tuple[str, str]:
    """(model, backend) of a queue name ("" backend: the model's own queue)."""
    model, _, backend = name.partition("@")
    return model, backend


def batch_limit(config: ControllerConfig, spec: ModelSpec) -> int:
    """Most jobs of `spec` in one pipeline call (the model's own limit within the controller's)."""
    model_limit = spec.limits.max_batch_size or config.max_batch_size
    return max(1, min(config.max_batch_size, model_limit))


def batch_key(plan: Plan, max_batch_size: int) -> Hashable | None:
    """What jobs must share to run in one pipeline call; None when this one never batches.

    The request's call fields (`omnirt._internal.batching`), and the model and output settings
    as well: one assignment's jobs are one model's, and export the same way.
    """
    spec, r = plan.spec, plan.request
    if max_batch_size <= 1 or not spec.supports_batching:
        return None
    call = batching.request_key(r)
    if call is None:
        return None
    output = (r.output_format, r.quality, r.inline_limit_bytes)
    return (queue_name(spec.id, pinned_backend(plan)), call, output)


def batch_key_id(key: Hashable | None) -> str:
    """A short, stable name for a batch key (part of a Redis key; "" for None)."""
    return "" if key is None else hashlib.sha1(repr(key).encode()).hexdigest()[:20]


def window_due(
    *,
    enqueued: float,
    now: float,
    window: float,
    busy_window: float,
    model_running: bool,
    peers: int,
    limit: int,
) -> float | None:
    """When a batchable job at the head of the queue must go anyway, or None to dispatch it now.

    `peers` queued jobs share its batch key, `limit` jobs fit in one call. A job that can fill
    a call goes at once; otherwise it waits for companions until `window` after it was queued,
    or `busy_window` when that is longer and jobs of its model run (under load the next
    companions are already on their way). Times and windows are in one unit, any.
    """
    if limit <= 1 or peers + 1 >= limit:
        return None
    if busy_window > window and model_running:
        window = busy_window
    if window <= 0:
        return None
    due = enqueued + window
    return due if due > now else None


# ---- joining a running step batch (docs/controller.md, "Rows") -----------------------------------

# The tasks whose calls a worker's step engine batches (text-to-image, image-to-image on the same
# denoiser, Wan's text-to-video), in the modes that have it.
STEP_TASKS = frozenset({Task.TEXT2IMAGE, Task.IMAGE2IMAGE, Task.TEXT2VIDEO})
STEP_MODES = frozenset({ExecutionMode.LEGACY_CALL, ExecutionMode.MODULAR})


def step_key(plan: Plan) -> Hashable | None:
    """What jobs must share to take denoiser steps together in a worker's step engine: the model,
    the latent shape, the request's runtime options and its LoRA adapter set. None when the job
    cannot join a running batch (another task or mode, a step cache, adapters in the modular
    mode): it waits for a slot as before.

    Prompts, seeds, step counts, guidance, strength and schedulers may differ: each call keeps its
    own loop, and only the denoiser's forward is shared.
    """
    spec, r = plan.spec, plan.request
    if spec.execution_mode not in STEP_MODES or r.task not in STEP_TASKS:
        return None
    if pinned_backend(plan):  # it waits for a slot on its backend's workers (docs/controller.md)
        return None
    if r.adapters and spec.execution_mode != ExecutionMode.LEGACY_CALL:
        return None
    runtime = r.extra.get("runtime") or {}
    if not isinstance(runtime, dict) or runtime.get("step_cache"):
        return None
    frames = r.num_frames if r.task is Task.TEXT2VIDEO else 0
    adapters = tuple((a.name, float(a.scale)) for a in r.adapters)  # one set per batch
    return (spec.id, r.width, r.height, frames, json.dumps(runtime, sort_keys=True, default=str), adapters)


def step_rows(plan: Plan) -> int:
    """The rows a job takes in a denoiser step: one per output, doubled for guidance (counted
    whether or not the model guides: an upper bound)."""
    return 2 * max(1, plan.request.num_outputs or 1)


def may_join(running_rows: int, rows: int, limit: int) -> bool:
    """Whether a job of `rows` may join a step batch of `running_rows` running on a worker whose
    step engine takes `limit` rows per step: the batch runs, and it has room."""
    return running_rows > 0 and running_rows + rows <= limit


def join_room(limit: int, running_rows: int, rows: int) -> int:
    """How many jobs of `rows` each may join, together, a step batch of `running_rows` on a worker
    whose step engine takes `limit` rows per step (0 when none may)."""
    return max(0, (limit - running_rows) // rows) if running_rows > 0 and rows > 0 else 0


def holds_back(ahead_priority: int, ahead_tenant: str, priority: int, tenant: str) -> bool:
    """Whether a queued job ahead of a joining one, which the same worker serves and which is left
    waiting, keeps it from joining: it never overtakes a job of higher priority, nor one of
    another tenant (fair share put that one first). Behind a job of its own tenant and priority
    that cannot join (another size), it may: that is the head-of-line blocking joins remove."""
    return ahead_priority > priority or ahead_tenant != tenant
