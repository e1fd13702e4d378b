"""Validation of text-to-speech requests on the `vits` family (MMS-TTS): what a TTS model cannot
honour is refused at the controller, naming the field, before a job is queued."""

from __future__ import annotations

import pytest

from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import validate
from omnirt.errors import InvalidRequest
from omnirt.types import GenerateRequest, Task

CATALOG = Catalog.load()


def req(**kw: object) -> GenerateRequest:
    base: dict[str, object] = {"model": "tiny-vits", "prompt": "hello there"}
    base.update(kw)
    return GenerateRequest(**base)  # type: ignore[arg-type]


def refused(request: GenerateRequest) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(request, CATALOG)
    return info.value


@pytest.mark.parametrize("model", ["tiny-vits", "mms-tts-eng", "facebook/mms-tts-eng"])
def test_a_tts_model_takes_a_prompt_and_makes_wav(model: str) -> None:
    plan = validate(req(model=model), CATALOG)
    assert (plan.request.task, plan.request.output_format) == (Task.TEXT2AUDIO, "wav")
    assert plan.spec.pipeline_class == "VitsModel" and plan.spec.family == "vits"
    # No diffusion defaults are filled in for the worker to refuse.
    assert plan.request.num_inference_steps is None and plan.request.duration_ms is None
    assert plan.request.width is None and plan.request.guidance_scale is None


@pytest.mark.parametrize(
    "field",
    [
        "duration_ms",
        "num_inference_steps",
        "guidance_scale",
        "width",
        "height",
        "negative_prompt",
        "num_frames",
    ],
)
@pytest.mark.parametrize("model", ["tiny-vits", "mms-tts-eng"])
def test_diffusion_fields_are_refused_naming_the_field(model: str, field: str) -> None:
    value: object = "noise" if field == "negative_prompt" else 64
    error = refused(req(model=model, **{field: value}))
    assert error.field == field
    assert f"takes no {field}" in str(error) and "vits family" in str(error)


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "pcm", "opus", "aac", "PCM"])
def test_the_speech_formats_are_accepted(fmt: str) -> None:
    assert validate(req(output_format=fmt), CATALOG).request.output_format == fmt.lower()


def test_an_unknown_audio_format_is_refused_naming_output_format() -> None:
    error = refused(req(output_format="ogg"))
    assert error.field == "output.format"
    assert "wav, flac, mp3, pcm, opus, aac" in str(error)


@pytest.mark.parametrize("prompt", ["", "   "])
def test_an_empty_prompt_is_refused(prompt: str) -> None:
    assert refused(req(prompt=prompt)).field == "prompt"


def test_a_prompt_over_the_models_cap_is_refused() -> None:
    assert CATALOG.resolve("mms-tts-eng").limits.max_prompt_chars == 4096
    validate(req(prompt="a" * 4096), CATALOG)
    error = refused(req(prompt="a" * 4097))
    assert error.field == "prompt" and "4096" in str(error)


def test_speed_travels_to_the_worker_as_an_extra() -> None:
    plan = validate(req(extra={"speed": 1.5}), CATALOG)
    assert plan.request.extra == {"speed": 1.5}
    assert plan.config["extra"] == {"speed": 1.5}
