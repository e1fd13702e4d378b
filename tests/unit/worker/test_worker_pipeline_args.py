"""The worker plans a request with the controller's defaults and seeds (`omnirt._internal.defaults`).

A request the controller validated reaches the worker filled in; one that reaches an executor
without its defaults (an executor's unit test) must run the same way.
"""

from __future__ import annotations

import dataclasses

import pytest

from omnirt import types as t
from omnirt._internal import defaults
from omnirt._internal.protocol.messages import AssignmentItem
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import validate
from omnirt.worker.pipelines.args import ItemPlan, plan_item

IMAGE = t.MediaInput(role=t.MediaRole.IMAGE, data=b"not decoded by plan_item")


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def _plan(request: t.GenerateRequest, spec: t.ModelSpec) -> ItemPlan:
    return plan_item(AssignmentItem(job_id="job-1", request=request), spec)


def _shown(plan: ItemPlan) -> tuple[object, ...]:
    req = plan.item.request
    return (plan.task, plan.common, plan.fps, plan.scheduler, plan.num_outputs, plan.seeds, req.strength)


@pytest.mark.parametrize(
    "fields",
    [
        {"model": "tiny-sd"},
        {"model": "tiny-sd", "task": t.Task.IMAGE2IMAGE, "inputs": [IMAGE]},  # strength 0.75
        {"model": "tiny-sd", "task": t.Task.IMAGE2IMAGE, "inputs": [IMAGE], "strength": 0.5},
        {"model": "tiny-sd", "width": 128, "num_outputs": 3, "guidance_scale": 0.0},
        {"model": "tiny-wan"},  # num_frames and fps from the model
        {"model": "tiny-wan", "fps": 12.0, "num_frames": 5},
    ],
)
def test_an_unvalidated_request_is_planned_as_the_controller_fills_it(
    catalog: Catalog, fields: dict[str, object]
) -> None:
    raw = t.GenerateRequest(prompt="a fox", seed=11, **fields)  # type: ignore[arg-type]
    spec = catalog.resolve(raw.model)
    validated = validate(raw, catalog).request
    assert _shown(_plan(raw, spec)) == _shown(_plan(validated, spec))


def test_what_the_worker_fills_in(catalog: Catalog) -> None:
    spec = catalog.resolve("tiny-sd")
    plan = _plan(t.GenerateRequest(model="tiny-sd", prompt="a fox", seed=5, num_outputs=2), spec)
    assert plan.common == {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 7.5}
    assert plan.seeds == [5, 6]
    assert plan.item.request.strength is None  # a default strength is for image-input tasks only
    image = _plan(t.GenerateRequest(model="tiny-sd", task=t.Task.INPAINT, inputs=[IMAGE]), spec)
    assert image.item.request.strength == 0.75 and image.num_outputs == 1
    video = _plan(t.GenerateRequest(model="tiny-wan", prompt="a fox"), catalog.resolve("tiny-wan"))
    assert video.common["num_frames"] == 9 and video.fps == 8.0


def test_an_unset_seed_is_random_and_each_output_counts_up(catalog: Catalog) -> None:
    spec = catalog.resolve("tiny-sd")
    request = t.GenerateRequest(model="tiny-sd", prompt="a fox", num_outputs=3)
    first = {_plan(request, spec).seeds[0] for _ in range(8)}
    for seed in first:
        assert 0 <= seed < defaults.RANDOM_SEED_BOUND
    assert len(first) > 1, "a fresh seed each time"
    plan = _plan(request, spec)
    assert plan.seeds == [plan.seeds[0] + i for i in range(3)]
    assert plan.item.request.seed == plan.seeds[0]  # the plan's request says which seed it ran
    assert request.seed is None and request.width is None  # the item's own request is left as is


def test_a_preset_comes_before_the_model_and_the_request_before_both() -> None:
    spec = t.ModelSpec(
        id="m",
        tasks=[t.Task.IMAGE2IMAGE],
        defaults=t.ModelDefaults(width=64, num_inference_steps=4, scheduler="DDIMScheduler", strength=0.6),
    )
    req = t.GenerateRequest(model="m", height=32, seed=3)
    defaults.apply(req, spec, {"num_inference_steps": 12, "width": 0, "scheduler": "PNDMScheduler"})
    # A 0 in the preset means none: the model's default applies (the task is the model's first).
    assert (req.width, req.height, req.num_inference_steps, req.scheduler) == (64, 32, 12, "PNDMScheduler")
    assert (req.strength, req.num_outputs, req.seed, req.fps) == (0.6, 1, 3, None)
    text = dataclasses.replace(spec, tasks=[t.Task.TEXT2IMAGE])
    plain = t.GenerateRequest(model="m")
    defaults.apply(plain, text)
    assert (plain.strength, plain.scheduler) == (None, "DDIMScheduler")
