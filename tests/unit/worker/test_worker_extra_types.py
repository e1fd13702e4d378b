"""A request's `extra` value must fit the type its pipeline argument is annotated with.

A 10,000-request fuzz ended four jobs INTERNAL with a Python error from inside the pipeline:
`extra.timesteps=false`, `extra.sigmas=1`, `extra.height={"scale": 2}` and
`extra.ip_adapter_image="pt"` (an image argument, which no JSON value can be). Each is now
INVALID_ARGUMENT naming `extra.<name>` before the call; an argument without an annotation, or
with one the worker cannot read, is taken as before.
"""

from __future__ import annotations

from typing import Any, List, Literal, Optional, Union  # noqa: UP035 - diffusers' spellings

import pytest
from options_testing import report, run_job

from omnirt import types as t
from omnirt._internal.protocol.messages import AssignmentItem
from omnirt.worker.failures import JobFailure
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.args import ItemPlan, check_arguments


class Image:
    """Stands for PIL's Image: a class no JSON value is an instance of."""


class Annotated:
    """A pipeline's `__call__` in the spellings diffusers uses. This file's annotations are text
    (`from __future__ import annotations`), as in a few diffusers modules; diffusers' own are
    typing objects (`test_diffusers_own_signature_is_read`): both are read."""

    def __call__(
        self,
        prompt: str = "",
        height: Optional[int] = None,  # noqa: UP045 - diffusers' own spelling
        timesteps: List[int] = None,  # type: ignore[assignment] # noqa: UP006, RUF013 - diffusers' spelling
        sigmas: list[float] | None = None,
        eta: float = 0.0,
        clip_skip: int | None = None,
        ip_adapter_image: Union[Image, list[Image], None] = None,  # noqa: UP007
        size: tuple[int, int] | None = None,
        cross_attention_kwargs: dict[str, Any] | None = None,
        mode: Literal["fast", "slow"] = "fast",
        flag: bool = False,
        unannotated=None,
        hidden: NoSuchType | None = None,  # type: ignore[name-defined] # noqa: F821 - unreadable on purpose
        **kwargs: Any,
    ) -> None:
        raise AssertionError("not called")


def checked(pipeline: Any, **extra: Any) -> JobFailure | None:
    plan = ItemPlan(AssignmentItem("job", t.GenerateRequest(model="m", extra=extra)), 1, [1], "png", "")
    plan.specific = dict(extra)
    try:
        check_arguments(pipeline, plan)
    except JobFailure as failure:
        return failure
    return None


def refusal(pipeline: Any, key: str, value: Any) -> str:
    failure = checked(pipeline, **{key: value})
    assert failure is not None, f"extra.{key}={value!r} was taken"
    assert (failure.error.code, failure.error.field) == ("INVALID_ARGUMENT", f"extra.{key}")
    assert failure.error.message.startswith(f"extra.{key}: "), failure.error.message
    return failure.error.message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("timesteps", False),
        ("timesteps", [1, 2.5]),
        ("sigmas", 1),
        ("sigmas", [1.0, "x"]),
        ("height", {"scale": 2}),
        ("height", 2.5),
        ("height", True),  # a bool is not an int, though Python says it is
        ("ip_adapter_image", "pt"),
        ("ip_adapter_image", ["pt"]),
        ("size", [64]),
        ("size", [64, "x"]),
        ("cross_attention_kwargs", [1]),
        ("mode", "medium"),
        ("flag", 1),
        ("prompt", 3),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_it(key: str, value: Any) -> None:
    message = refusal(Annotated(), key, value)
    assert "expected" in message and repr(value)[:20] in message, message


@pytest.mark.parametrize(
    "extra",
    [
        {"timesteps": [999, 500, 1]},
        {"timesteps": None},  # the default, said out loud
        {"sigmas": [1.0, 0.5, 0]},  # an int where a float goes
        {"height": 64},
        {"height": None},
        {"eta": 1},
        {"clip_skip": 1},
        {"size": [64, 64]},
        {"cross_attention_kwargs": {"scale": 0.5}},
        {"mode": "slow"},
        {"flag": True},
        {"unannotated": {"anything": [1, "x"]}},
    ],
)
def test_a_value_of_the_right_type_is_taken(extra: dict[str, Any]) -> None:
    assert checked(Annotated(), **extra) is None


def test_an_annotation_the_worker_cannot_read_takes_anything() -> None:
    assert checked(Annotated(), hidden={"x": [1, "y"]}) is None


def test_diffusers_own_signature_is_read() -> None:
    from diffusers import StableDiffusionPipeline

    pipeline = object.__new__(StableDiffusionPipeline)
    for key, value in [
        ("timesteps", False),
        ("sigmas", 1),
        ("height", {"scale": 2}),
        ("ip_adapter_image", "pt"),
    ]:
        refusal(pipeline, key, value)
    assert checked(pipeline, timesteps=[999, 1], sigmas=[1.0, 0.5], height=64) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [("timesteps", False), ("sigmas", 1), ("height", {"scale": 2}), ("ip_adapter_image", "pt")],
)
def test_the_fuzz_findings_fail_invalid_argument_on_a_real_pipeline(
    executor: LegacyCallExecutor, key: str, value: Any
) -> None:
    outcome = run_job(executor, extra={key: value})
    assert outcome.error is not None, "the job ran"
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", f"extra.{key}"), outcome.error


def test_a_valid_extra_still_runs(executor: LegacyCallExecutor) -> None:
    # An int where the annotation says float (`eta: float`), null where the default is None.
    config = report(run_job(executor, extra={"eta": 0, "clip_skip": None})).config_resolved
    assert (config["eta"], config["clip_skip"]) == (0, None)
