"""Media inputs of the pipeline program: how an image2image, inpaint or image2video job's images
reach the ranks.

The daemon side (`shipped`) checks the task has the inputs it needs, reads `file://` inputs into
bytes under the worker's `--input-roots` (the ranks read no file: they may run where the
daemon's paths do not) and bounds the bytes one request sends over the channel; the inputs then
travel inside the plan as their encoded bytes, as the client sent them. Every rank decodes them
with legacy_call's own code (`args.pipeline_kwargs` -> `media_inputs.image_inputs`: RGB, L for a
mask, Lanczos / nearest resize to the request's size), so both modes feed the pipeline the same
pixels. Decoded images stay on the ranks: `without_media` keeps them out of the reply.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omnirt.worker.failures import JobFailure
from omnirt.worker.pipelines import media_inputs
from omnirt.worker.pipelines.args import INVALID_ARGUMENT, MEDIA_ARGUMENTS, ItemPlan, check_task_inputs


def check_required(plan: ItemPlan) -> None:
    """A media task without one of its inputs: INVALID_ARGUMENT naming `inputs`."""
    check_task_inputs(plan.task, plan.item.request)


def shipped(plan: ItemPlan, policy: media_inputs.InputPolicy) -> ItemPlan:
    """`plan` as the ranks receive it: its required inputs checked, `file://` ones read into bytes,
    all of them together within `policy`'s bound (the model's `limits.max_input_bytes`, else the
    worker's `--input-max-bytes`). JobFailure(INVALID_ARGUMENT) naming the field."""
    check_required(plan)
    request = plan.item.request
    if not request.inputs:
        return plan
    request = media_inputs.with_uris_read(request, policy)
    total = sum(len(media.data) for media in request.inputs)
    bound = policy.request_max_bytes or policy.max_bytes
    if bound and total > bound:
        reason = f"the request's inputs are {total} bytes, over the limit of {bound} bytes"
        raise JobFailure(INVALID_ARGUMENT, reason, "inputs")
    return dataclasses.replace(plan, item=dataclasses.replace(plan.item, request=request))


def without_media(specific: dict[str, Any]) -> dict[str, Any]:
    """`specific` less its decoded images: the daemon reports no media, and they need not travel back."""
    media = set(MEDIA_ARGUMENTS.values())
    return {key: value for key, value in specific.items() if key not in media}
