"""Each call's scheduler is a copy of a pristine one: it must behave as a deep copy, and share nothing.
A call's view of the pipeline asks diffusers for the execution device once per pipeline, and runs
as the pipeline does."""

from __future__ import annotations

import copy
import inspect
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import diffusers
import numpy as np
import pytest
import torch

from omnirt.worker.modes.schedulers import call_view, scheduler_copy, seed_noise_sampler
from omnirt.worker.tiny.registry import ensure_builtin


def _scheduler_classes() -> list[type]:
    """diffusers' scheduler classes (its module is lazy: the names come from dir())."""
    found = []
    for name in dir(diffusers):
        if "Scheduler" not in name:
            continue
        cls = getattr(diffusers, name, None)
        if isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin):
            found.append(cls)
    return found


def _steps(scheduler: Any, seed: int) -> tuple[Any, list[Any]]:
    """A function making one denoising step per call, as a pipeline would, and the 4 timesteps."""
    gen = torch.Generator().manual_seed(seed)
    seed_noise_sampler(scheduler, [seed])  # as the worker does (DPM-Solver SDE's Brownian noise)
    scheduler.set_timesteps(4)
    state = {"sample": torch.randn(1, 4, 8, 8, generator=gen)}
    takes_generator = "generator" in inspect.signature(scheduler.step).parameters
    extra = {"generator": torch.Generator().manual_seed(seed)} if takes_generator else {}

    def step(t: Any) -> Any:
        sample = state["sample"]
        if hasattr(scheduler, "scale_model_input"):
            scheduler.scale_model_input(sample, t)
        noise = torch.randn(1, 4, 8, 8, generator=gen)
        state["sample"] = scheduler.step(noise, t, sample, **extra).prev_sample
        return state["sample"]

    return step, list(scheduler.timesteps[:4])


def _run(scheduler: Any, seed: int) -> Any:
    step, timesteps = _steps(scheduler, seed)
    return torch.stack([step(t) for t in timesteps])


def test_copies_run_like_deep_copies_side_by_side_and_leave_the_template_alone() -> None:
    checked = []
    for cls in _scheduler_classes():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                template = cls()
                expected = [_run(copy.deepcopy(template), seed) for seed in (1, 2)]
            except Exception:  # schedulers that need arguments or other step inputs: not this test's
                continue
            before = copy.deepcopy(template.__dict__)
            # Two calls at once on copies of one template (two slots), their steps interleaved.
            (step_a, times_a), (step_b, times_b) = (
                _steps(scheduler_copy(template), 1),
                _steps(scheduler_copy(template), 2),
            )
            got_a, got_b = [], []
            for t_a, t_b in zip(times_a, times_b, strict=True):
                got_a.append(step_a(t_a))
                got_b.append(step_b(t_b))
        assert torch.equal(torch.stack(got_a), expected[0]), cls.__name__
        assert torch.equal(torch.stack(got_b), expected[1]), cls.__name__
        assert template.__dict__.keys() == before.keys(), cls.__name__
        for name, value in before.items():
            if isinstance(value, torch.Tensor):
                assert torch.allclose(template.__dict__[name], value, rtol=0, atol=0, equal_nan=True), name
            elif isinstance(value, np.ndarray):
                assert np.array_equal(template.__dict__[name], value, equal_nan=True), name
            else:
                assert template.__dict__[name] == value, (cls.__name__, name)
        checked.append(cls.__name__)
    # The usual ones are among those checked (the rest need arguments this test does not give).
    usual = {"EulerDiscreteScheduler", "DPMSolverMultistepScheduler", "UniPCMultistepScheduler"}
    assert usual <= set(checked)
    assert len(checked) >= 20, checked


@pytest.mark.parametrize("name", ["EulerDiscreteScheduler", "DPMSolverMultistepScheduler"])
def test_a_copy_owns_its_mutable_state(name: str) -> None:
    template = getattr(diffusers, name)()
    one, two = scheduler_copy(template), scheduler_copy(template)
    for attr, value in vars(template).items():
        if isinstance(value, torch.Tensor | np.ndarray | list) or type(value) is dict:
            assert vars(one)[attr] is not value and vars(one)[attr] is not vars(two)[attr], attr
    assert vars(one)["_internal_dict"] is vars(template)["_internal_dict"]  # the frozen config is shared


def test_call_views_ask_for_the_execution_device_once_and_run_as_the_pipeline(model_dir: Path) -> None:
    pipeline = diffusers.StableDiffusionPipeline.from_pretrained(ensure_builtin("tiny-sd", model_dir))
    pipeline.set_progress_bar_config(disable=True)
    walks = []
    walk = diffusers.DiffusionPipeline._execution_device.fget

    def counted(self: Any) -> Any:
        walks.append(self)
        return walk(self)

    with mock.patch.object(diffusers.DiffusionPipeline, "_execution_device", property(counted)):
        views = [call_view(pipeline) for _ in range(3)]
        assert [view._execution_device for view in views] == [torch.device("cpu")] * 3
    assert walks == [pipeline]  # diffusers walks the modules once, not once a call
    view = views[0]
    assert type(view).__name__ == "StableDiffusionPipeline"
    assert isinstance(view, diffusers.StableDiffusionPipeline)
    assert view.unet is pipeline.unet and "_omnirt_execution_device" not in pipeline.config

    def image(pipe: Any) -> Any:
        generator = torch.Generator().manual_seed(3)
        size = {"width": 64, "height": 64}
        return pipe("a fox", **size, num_inference_steps=2, generator=generator, output_type="np")

    np.testing.assert_array_equal(image(view).images, image(pipeline).images)
