"""Jobs the controller batches share one call on the worker: both key by `omnirt._internal.batching`.

The controller keys a request after validation filled in its defaults; the worker keys the values
it resolved itself, so a request that reaches an executor without its defaults groups the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from omnirt import types as t
from omnirt._internal import batching
from omnirt._internal.protocol.messages import AssignmentItem
from omnirt.controller.core.batching import batch_key
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import validate
from omnirt.worker.pipelines.args import plan_item

IMAGE = t.MediaInput(role=t.MediaRole.IMAGE, data=b"not decoded by plan_item")
LORA = t.Adapter(name="detail", scale=0.5)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def request(seed: int, **fields: Any) -> t.GenerateRequest:
    return t.GenerateRequest(model=fields.pop("model", "tiny-sd"), prompt=f"job {seed}", seed=seed, **fields)


def controller_key(req: t.GenerateRequest, catalog: Catalog) -> object:
    return batch_key(validate(req, catalog), max_batch_size=8)


def worker_key(req: t.GenerateRequest, catalog: Catalog, job_id: str = "job-1") -> str:
    return plan_item(AssignmentItem(job_id=job_id, request=req), catalog.resolve(req.model)).group_key()


@pytest.mark.parametrize(
    ("a", "b", "together"),
    [
        ({}, {"negative_prompt": "blurry", "num_outputs": 3}, True),  # prompts, seeds, counts differ
        ({}, {"width": 64, "guidance_scale": 7.5}, True),  # the model's defaults, spelled out
        ({"guidance_scale": 5}, {"guidance_scale": 5.0}, True),  # a number's type does not split
        ({}, {"width": 128}, False),
        ({}, {"num_inference_steps": 2}, False),
        ({}, {"guidance_scale": 0.0}, False),
        ({}, {"scheduler": "EulerDiscreteScheduler"}, False),
        ({}, {"adapters": [LORA]}, False),
        ({"adapters": [LORA]}, {"adapters": [t.Adapter(name="detail", scale=0.5)]}, True),
        ({"adapters": [LORA]}, {"adapters": [t.Adapter(name="detail", scale=1.0)]}, False),
        ({"model": "tiny-wan"}, {"model": "tiny-wan", "num_frames": 5}, False),
        ({"model": "tiny-wan"}, {"model": "tiny-wan", "fps": 12.0}, False),
    ],
)
def test_the_controller_and_the_worker_put_the_same_jobs_together(
    catalog: Catalog, a: dict[str, Any], b: dict[str, Any], together: bool
) -> None:
    first, second = request(1, **a), request(2, **b)
    assert (controller_key(first, catalog) == controller_key(second, catalog)) is together
    validated = [validate(r, catalog).request for r in (first, second)]
    assert (worker_key(validated[0], catalog) == worker_key(validated[1], catalog)) is together
    # Unvalidated (an executor's unit test): the worker fills the defaults in and groups the same.
    assert (worker_key(first, catalog) == worker_key(second, catalog)) is together


def test_media_inputs_never_batch(catalog: Catalog) -> None:
    fields: dict[str, Any] = {"task": t.Task.IMAGE2IMAGE, "inputs": [IMAGE]}
    assert controller_key(request(1, **fields), catalog) is None
    one, two = request(1, **fields), request(1, **fields)
    assert worker_key(one, catalog, "job-1") != worker_key(two, catalog, "job-2")


def test_the_controller_keeps_outputs_and_models_apart(catalog: Catalog) -> None:
    plain = controller_key(request(1), catalog)
    assert controller_key(request(2, output_format="jpeg"), catalog) != plain
    assert controller_key(request(2, inline_limit_bytes=1024), catalog) != plain
    assert controller_key(request(2, model="tiny-sd-modular"), catalog) != plain


def test_a_field_the_rule_does_not_know_is_refused() -> None:
    assert batching.call_key({"width": 64}) == batching.call_key({"width": 64.0, "height": None})
    with pytest.raises(ValueError, match="max_sequence_length"):
        batching.call_key({"width": 64, "max_sequence_length": 77})
