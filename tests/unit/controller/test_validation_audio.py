"""Validation of text2audio requests: the audio formats, and duration_ms within the model's limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnirt._internal import catalog_convert
from omnirt._internal import convert as c
from omnirt.controller.core.catalog import Catalog, CatalogError, load_file
from omnirt.controller.core.validation import validate
from omnirt.errors import InvalidRequest
from omnirt.types import Artifact, GenerateRequest, MediaKind, Task

AUDIO_CATALOG = """
[[models]]
id = "my-audio"
family = "stable-audio"
tasks = ["text2audio"]
source = "builtin:tiny-stable-audio"
pipeline_class = "StableAudioPipeline"
[models.limits]
max_duration_ms = 2048

[[models]]
id = "unbounded-audio"
family = "stable-audio"
tasks = ["text2audio"]
source = "builtin:tiny-stable-audio"
pipeline_class = "StableAudioPipeline"
"""


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    path = tmp_path_factory.mktemp("catalog") / "audio.toml"
    path.write_text(AUDIO_CATALOG)
    return Catalog.load([path])


def req(**kw: object) -> GenerateRequest:
    base: dict[str, object] = {"model": "my-audio", "prompt": "rain on a tin roof"}
    base.update(kw)
    return GenerateRequest(**base)  # type: ignore[arg-type]


def refused(request: GenerateRequest, catalog: Catalog) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(request, catalog)
    return info.value


def test_text2audio_defaults_to_wav(catalog: Catalog) -> None:
    plan = validate(req(), catalog)
    assert (plan.request.task, plan.request.output_format) == (Task.TEXT2AUDIO, "wav")


@pytest.mark.parametrize(("asked", "fmt"), [("wav", "wav"), ("flac", "flac"), ("mp3", "mp3"), ("MP3", "mp3")])
def test_the_audio_formats_are_accepted(catalog: Catalog, asked: str, fmt: str) -> None:
    assert validate(req(output_format=asked), catalog).request.output_format == fmt


@pytest.mark.parametrize("fmt", ["ogg", "png", "mp4", "wma"])
def test_other_formats_are_refused_naming_the_audio_ones(catalog: Catalog, fmt: str) -> None:
    error = refused(req(output_format=fmt), catalog)
    assert error.field == "output.format"
    assert "wav, flac, mp3" in str(error)


def test_duration_up_to_the_models_limit_is_accepted(catalog: Catalog) -> None:
    assert validate(req(duration_ms=2048), catalog).request.duration_ms == 2048
    assert validate(req(duration_ms=1), catalog).request.duration_ms == 1


def test_a_duration_past_the_models_limit_is_refused(catalog: Catalog) -> None:
    error = refused(req(duration_ms=2049), catalog)
    assert error.field == "duration_ms"
    assert "at most 2048" in str(error)


@pytest.mark.parametrize("duration_ms", [0, -5])
def test_a_duration_must_be_positive(catalog: Catalog, duration_ms: int) -> None:
    error = refused(req(duration_ms=duration_ms), catalog)
    assert error.field == "duration_ms" and "positive" in str(error)


def test_a_model_without_a_limit_takes_any_int32_duration(catalog: Catalog) -> None:
    assert validate(req(model="unbounded-audio", duration_ms=600_000), catalog).request.duration_ms == 600_000
    assert refused(req(model="unbounded-audio", duration_ms=2**31), catalog).field == "duration_ms"


def test_text2audio_needs_a_prompt(catalog: Catalog) -> None:
    assert refused(req(prompt="  "), catalog).field == "prompt"


def test_the_limit_travels_in_the_model_spec(catalog: Catalog) -> None:
    spec = catalog.resolve("my-audio")
    assert spec.limits.max_duration_ms == 2048
    assert (
        catalog_convert.model_from_proto(catalog_convert.model_to_proto(spec)).limits.max_duration_ms == 2048
    )


def test_a_negative_limit_in_a_catalog_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[models]]\nid = "x"\ntasks = ["text2audio"]\n[models.limits]\nmax_duration_ms = -1\n')
    with pytest.raises(CatalogError, match="max_duration_ms"):
        load_file(path)


def test_an_audio_artifact_keeps_its_rate_and_channels_on_the_wire() -> None:
    clip = Artifact(
        index=0, kind=MediaKind.AUDIO, mime_type="audio/flac", data=b"fLaC", duration_ms=1500,
        sample_rate=44100, channels=2,
    )  # fmt: skip
    back = c.artifact_from_proto(c.artifact_to_proto(clip))
    assert back == clip
