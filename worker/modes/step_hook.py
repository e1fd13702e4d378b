"""`attach`: call a hook at the end of every denoising step of one pipeline call.

Diffusers pipelines end a step in one of three ways: `callback_on_step_end` (most), the older
`callback(step, timestep, latents)` (Stable Audio), or neither (HunyuanVideo 1.5: the loop only
updates its progress bar). For the last, the call's own copy of the pipeline gets a
`progress_bar` whose `update()` is the step's end: the loop calls it once per step, after the
scheduler step, exactly where `callback_on_step_end` would run. The hook may raise to stop the
call (cancel, deadline) there too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

StepHook = Callable[[Any, int, Any, dict[str, Any]], dict[str, Any]]
"""A diffusers `callback_on_step_end`: (pipeline, step index, timestep, tensors) -> tensors."""


def attach(view: Any, accepted: frozenset[str], kwargs: dict[str, Any], hook: StepHook) -> str:
    """Wire `hook` into the call of `view` (a per-call copy of the pipeline) with `kwargs`;
    returns which way: `callback_on_step_end`, `callback` or `progress_bar`."""
    if "callback_on_step_end" in accepted:
        kwargs["callback_on_step_end"] = hook
        return "callback_on_step_end"
    if "callback" in accepted:
        kwargs["callback"] = lambda step, timestep, _latents: hook(view, step, timestep, {})
        return "callback"
    # An instance attribute shadows DiffusionPipeline.progress_bar for this copy only.
    object.__setattr__(view, "progress_bar", _StepBars(view, hook))
    return "progress_bar"


class _StepBars:
    """Stands in for `pipeline.progress_bar(iterable=None, total=None)`."""

    def __init__(self, view: Any, hook: StepHook) -> None:
        self.view = view
        self.hook = hook
        self.steps = 0

    def __call__(self, iterable: Iterable[Any] | None = None, total: int | None = None) -> Any:
        if iterable is not None:
            return _steps_of(iterable, self)
        return _StepBar(self)

    def step_done(self) -> None:
        self.steps += 1
        self.hook(self.view, self.steps - 1, None, {})


class _StepBar:
    """`with pipeline.progress_bar(total=n) as bar: ... bar.update()`: each update ends a step."""

    def __init__(self, bars: _StepBars) -> None:
        self.bars = bars

    def __enter__(self) -> _StepBar:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def update(self, n: int = 1) -> None:
        for _ in range(n):
            self.bars.step_done()

    def close(self) -> None:
        return None


def _steps_of(iterable: Iterable[Any], bars: _StepBars) -> Any:
    """`for x in pipeline.progress_bar(items)`: a step ends when the loop asks for the next item
    (or leaves after the last)."""
    for item in iterable:
        yield item
        bars.step_done()
