"""Validation turns requests into plans or precise errors naming the field."""

from __future__ import annotations

import time

import pytest

from omnirt.controller.catalog import Catalog, CatalogError, load_file
from omnirt.controller.validation import validate
from omnirt.errors import InvalidRequest, ModelNotFound
from omnirt.types import GenerateRequest, MediaInput, MediaRole, Task


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def req(**kw: object) -> GenerateRequest:
    base: dict[str, object] = {"model": "tiny-sd", "prompt": "a red fox"}
    base.update(kw)
    return GenerateRequest(**base)  # type: ignore[arg-type]


def test_defaults_fill_unset_fields(catalog: Catalog) -> None:
    plan = validate(req(seed=7), catalog)
    r = plan.request
    assert (r.width, r.height, r.num_inference_steps, r.num_outputs, r.seed) == (64, 64, 4, 1, 7)
    assert r.output_format == "png"
    assert plan.config["model"] == "tiny-sd" and plan.config["seed"] == 7


def test_alias_and_preset(catalog: Catalog) -> None:
    plan = validate(req(model="tiny-stable-diffusion", preset="quality"), catalog)
    assert plan.spec.id == "tiny-sd"
    assert plan.request.num_inference_steps == 12
    # an explicit field beats the preset
    assert validate(req(preset="quality", num_inference_steps=3), catalog).request.num_inference_steps == 3


def test_unset_seed_is_chosen_and_reported(catalog: Catalog) -> None:
    plan = validate(req(), catalog)
    assert plan.request.seed is not None and plan.config["seed"] == plan.request.seed


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"prompt": ""}, "prompt", "required"),
        ({"num_inference_steps": 0}, "num_inference_steps", "positive"),
        ({"num_inference_steps": -3}, "num_inference_steps", "positive"),
        ({"width": 65}, "width", "multiple of 8"),
        ({"height": 1024}, "height", "at most 512"),
        ({"task": Task.TEXT2VIDEO}, "task", "does not do text2video"),
        ({"preset": "turbo"}, "preset", "unknown preset 'turbo'"),
        ({"priority": -1}, "priority", "between 0 and 100"),
        ({"priority": 1000}, "priority", "between 0 and 100"),
        ({"deadline_ms": 1}, "deadline_ms", "already past"),
        ({"num_outputs": 99}, "num_outputs", "at most 8"),
        ({"seed": -5}, "seed", "between 0"),
        ({"guidance_scale": -1.0}, "guidance_scale", "negative"),
        ({"output_format": "mp4"}, "output.format", "not one of png"),
    ],
)
def test_bad_fields_are_named(catalog: Catalog, changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(req(**changes), catalog)
    assert info.value.field == field
    assert words in info.value.message
    assert info.value.message.startswith(field)


def test_unknown_model_suggests_close_matches(catalog: Catalog) -> None:
    with pytest.raises(ModelNotFound) as info:
        validate(req(model="tiny-sdx"), catalog)
    assert "tiny-sdx" in info.value.message and "did you mean tiny-sd" in info.value.message


def test_missing_model_is_invalid(catalog: Catalog) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(req(model=""), catalog)
    assert info.value.field == "model"


def test_validation_does_not_change_the_request(catalog: Catalog) -> None:
    original = req()
    validate(original, catalog)
    assert original.width is None and original.seed is None


def test_future_deadline_is_accepted(catalog: Catalog) -> None:
    future = int(time.time() * 1000) + 60_000
    assert validate(req(deadline_ms=future), catalog).request.deadline_ms == future


def test_inputs_need_data_and_role(catalog: Catalog) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(req(inputs=[MediaInput(role=MediaRole.IMAGE)]), catalog)
    assert info.value.field == "inputs[0]"


def test_user_catalog_adds_and_replaces(tmp_path) -> None:  # type: ignore[no-untyped-def]
    extra = tmp_path / "mine.toml"
    extra.write_text(
        '[[models]]\nid = "my-sd"\naliases = ["mine"]\ntasks = ["text2image"]\n'
        'source = "/models/sd15"\npipeline_class = "StableDiffusionPipeline"\n'
        "[models.defaults]\nwidth = 512\nheight = 512\nnum_inference_steps = 20\n"
    )
    catalog = Catalog.load([extra])
    assert {"tiny-sd", "my-sd"} <= {s.id for s in catalog}
    plan = validate(req(model="mine"), catalog)
    assert (plan.spec.source, plan.request.width) == ("/models/sd15", 512)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[[models]]\ntasks = ["text2image"]\n', "needs a string `id`"),
        ('[[models]]\nid = "x"\ntasks = ["paint"]\n', "'paint' is not a valid Task"),
        ('[[models]]\nid = "x"\ntasks = ["text2image"]\nexecution_mode = "magic"\n', "execution_mode"),
        ('[[models]]\nid = "x"\ntasks = ["text2image"]\ncolour = 1\n', "unknown keys ['colour']"),
        ("[[models]\n", "mine.toml"),
    ],
)
def test_bad_catalog_files_name_the_problem(tmp_path, text: str, words: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_file(path)
    assert words in str(info.value)
