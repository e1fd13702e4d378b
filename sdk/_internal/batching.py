"""The request's part of the batch rule, once: the fields the jobs of one pipeline call share.

The controller files its queued jobs by it (`omnirt.controller.core.batching.batch_key`, on the
request after validation filled in the defaults) and the worker groups an assignment's jobs by it
(`ItemPlan.group_key`, on the values it resolved itself, so a request that reaches an executor
with its defaults unset groups with one that spelled them out). Jobs the controller batched thus
share one call on the worker. Prompts, negative prompts, seeds and output counts may differ.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from omnirt.types import Adapter, GenerateRequest

# The fields that shape one pipeline call: every job of the call has the same value in each.
CALL_FIELDS = (
    "task",
    "width",
    "height",
    "num_frames",
    "fps",
    "duration_ms",  # text2audio: one clip length per call
    "num_inference_steps",
    "guidance_scale",
    "strength",
    "scheduler",
    "extra",  # the pipeline's own arguments (in the controller's request: the runtime options too)
    "adapters",  # different adapters never share a call
)


def batchable(request: GenerateRequest) -> bool:
    """False for a request with media inputs: its images are its own, so it runs alone."""
    return not request.inputs


def call_key(fields: Mapping[str, Any]) -> str:
    """The key of one job's `CALL_FIELDS`: jobs with equal keys may share one pipeline call.

    A field left out counts as unset; `adapters` is a sequence of `omnirt.types.Adapter`.
    Raises ValueError for a name that is not a call field: a field that shapes the call but is
    missing here would let jobs that differ in it share one.
    """
    unknown = set(fields) - set(CALL_FIELDS)
    if unknown:
        raise ValueError(f"not call fields: {sorted(unknown)} (see CALL_FIELDS)")
    adapters: Sequence[Adapter] = fields.get("adapters") or ()
    values = {name: _number(value) for name, value in fields.items()}
    values["adapters"] = [(a.name, float(a.scale)) for a in adapters]
    return json.dumps([values.get(name) for name in CALL_FIELDS], sort_keys=True, default=str)


def _number(value: Any) -> Any:
    """5.0 as 5: a number's type does not split a batch.

    A catalog may spell a default either way; the wire carries a double.
    """
    return int(value) if isinstance(value, float) and value.is_integer() else value


def request_key(request: GenerateRequest) -> str | None:
    """`call_key` of the request's fields as they stand; None when it never batches."""
    if not batchable(request):
        return None
    return call_key({name: getattr(request, name) for name in CALL_FIELDS})
