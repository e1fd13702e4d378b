"""The batch rule of the controller, once: which queued jobs share one pipeline call, how many,
and how long the first of them waits for companions.

Both engines decide with it: the memory engine in its dispatch, the Redis engine through its
CLAIM script, which keeps a copy of `window_due` in Lua because the decision must be atomic with
the claim inside Redis. tests/integration/test_batching_rule.py holds the two to the same answers.
Which request fields two jobs must share is `omnirt._internal.batching`, which the worker's
grouping reads too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from omnirt._internal import batching
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.validation import Plan
from omnirt.types import ModelSpec


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
    return (spec.id, call, (r.output_format, r.quality, r.inline_limit_bytes))


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
