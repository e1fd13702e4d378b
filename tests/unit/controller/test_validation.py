"""Validation turns requests into plans or precise errors naming the field."""

from __future__ import annotations

import time

import pytest

from omnirt._internal import catalog_convert
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog, CatalogError, load_file
from omnirt.controller.core.validation import validate
from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.errors import InvalidRequest, JobNotFound, ModelNotFound, WorkerNotFound
from omnirt.types import Adapter, GenerateRequest, MediaInput, MediaRole, ModelSpec, Task
from tests.unit.controller.test_engine import now, submit


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
        (
            '[[models]]\nid = "x"\ntasks = ["text2image"]\n[models.limits]\nmax_width = 3_000_000_000\n',
            "max_width",
        ),
        (
            '[[models]]\nid = "x"\ntasks = ["text2image"]\n[models.limits]\nmax_prompt_chars = -1\n',
            "max_prompt",
        ),
        # A name no request could ask for (a request's model is at most 256 characters).
        (f'[[models]]\nid = "{"m" * 300}"\ntasks = ["text2image"]\n', "at most 256 characters"),
        ('[[models]]\nid = "x"\ntasks = ["text2image"]\naliases = ["' + "a" * 300 + '"]\n', "aliases"),
        ('[[models]]\nid = "sd@cuda"\ntasks = ["text2image"]\n', "may not contain '@'"),
    ],
)
def test_bad_catalog_files_name_the_problem(tmp_path, text: str, words: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.toml"
    path.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_file(path)
    assert words in str(info.value)


# ---- bounds: nothing accepted may be unencodable later, no error echoes unbounded text ----------

INT64_MAX = 2**63 - 1
# The most an error message may be: its field, a reason and a bounded quote of the input.
MESSAGE_CHARS = 300


def free_catalog() -> Catalog:
    """A model with no limits of its own: the controller's bounds are all that applies."""
    return Catalog([ModelSpec(id="free", tasks=[Task.TEXT2IMAGE], source="builtin:null")])


def invalid(request: GenerateRequest, catalog: Catalog, field: str) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate(request, catalog)
    error = info.value
    assert error.field == field, error
    assert error.message.startswith(field), error
    assert len(error.message) <= MESSAGE_CHARS, error.message[:500]
    return error


def nested_dicts(keys: str) -> dict[str, object]:
    value: object = 1
    for key in reversed(keys):
        value = {key: value}
    return value  # type: ignore[return-value]


def nested_lists(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"timeout_ms": INT64_MAX}, "timeout_ms"),
        ({"deadline_ms": INT64_MAX}, "deadline_ms"),
        ({"width": 2**40}, "width"),
        ({"height": 2**31}, "height"),
        ({"num_inference_steps": 2**31}, "num_inference_steps"),
        ({"num_outputs": 2**31}, "num_outputs"),
        ({"fps": float("nan")}, "fps"),
        ({"fps": float("inf")}, "fps"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"guidance_scale": float("inf")}, "guidance_scale"),
        ({"strength": float("nan")}, "strength"),
        ({"seed": 2**64}, "seed"),
        ({"quality": 101}, "output.quality"),
        ({"inline_limit_bytes": -1}, "output.inline_limit_bytes"),
        ({"inline_limit_bytes": 2**64}, "output.inline_limit_bytes"),
        ({"duration_ms": -1}, "duration_ms"),
        ({"duration_ms": 2**31}, "duration_ms"),
        ({"adapters": [Adapter("a", float("nan"))]}, "adapters[0].scale"),
    ],
)
def test_numbers_out_of_range_are_named(changes: dict[str, object], field: str) -> None:
    invalid(req(model="free", **changes), free_catalog(), field)


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"a": nested_lists(48)}, "extra.a" + "[0]" * 15),
        (nested_dicts("abcdefghijklmnopq"), "extra.a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p"),
        ({"x": float("inf")}, "extra.x"),
        ({"x": float("-inf")}, "extra.x"),
        ({"a": {"b": [1.0, float("nan")]}}, "extra.a.b[1]"),
        ({"blob": "x" * 300_000}, "extra"),
        ({"k" * 300: 1}, "extra"),
        ({"big": 10**400}, "extra.big"),
        ({"clip_skip": -1}, "extra.clip_skip"),
        ({"clip_skip": 1.5}, "extra.clip_skip"),
        ({"clip_skip": True}, "extra.clip_skip"),
        ({"clip_skip": "2"}, "extra.clip_skip"),
        ({"clip_skip": 10_000}, "extra.clip_skip"),
        ({"guidance_rescale": 1.5}, "extra.guidance_rescale"),
        ({"guidance_rescale": -0.1}, "extra.guidance_rescale"),
        ({"guidance_rescale": "0.5"}, "extra.guidance_rescale"),
    ],
)
def test_bad_extras_are_named_with_their_path(catalog: Catalog, extra: dict[str, object], field: str) -> None:
    invalid(req(extra=extra), catalog, field)


def test_extras_within_bounds_are_accepted(catalog: Catalog) -> None:
    extra = {"clip_skip": 2.0, "guidance_rescale": 0.7, "a": nested_lists(10), "s": "x" * 1000}
    assert validate(req(extra=extra), catalog).request.extra == extra


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"prompt": "x" * 50 * 1024 * 1024}, "prompt"),
        ({"prompt": "x" * 32_001}, "prompt"),
        ({"negative_prompt": "x" * 32_001}, "negative_prompt"),
        ({"scheduler": "S" * 300}, "scheduler"),
        ({"preset": "p" * 100_000}, "preset"),
        ({"output_format": "f" * 100_000}, "output.format"),
        ({"idempotency_key": "k" * 100_000}, "idempotency_key"),
        ({"labels": {f"k{i}": "v" for i in range(100)}}, "labels"),
        ({"labels": {"k" * 300: "v"}}, "labels"),
        ({"labels": {"k": "v" * 100_000}}, "labels.k"),
        ({"adapters": [Adapter("a" * 300)]}, "adapters[0].name"),
        ({"adapters": [Adapter("loras/" + "a" * 300)]}, "adapters[0].name"),
        ({"adapters": [Adapter("loras/../../etc")]}, "adapters[0].name"),
        ({"adapters": [Adapter("lora\x00")]}, "adapters[0].name"),
        ({"adapters": [Adapter(f"l{i}") for i in range(100)]}, "adapters"),
        ({"inputs": [MediaInput(role=MediaRole.IMAGE, uri="file:///" + "u" * 100_000)]}, "inputs[0].uri"),
        (
            {"inputs": [MediaInput(role=MediaRole.IMAGE, data=b"x", mime_type="m" * 100_000)]},
            "inputs[0].mime_type",
        ),
        ({"inputs": [MediaInput(role=MediaRole.IMAGE, data=b"x" * (20 << 20))] * 2}, "inputs"),
    ],
)
def test_strings_and_collections_are_bounded(
    catalog: Catalog, changes: dict[str, object], field: str
) -> None:
    invalid(req(**changes), catalog, field)


def test_a_catalog_sets_its_own_prompt_and_input_limits(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "mine.toml"
    path.write_text(
        '[[models]]\nid = "long"\ntasks = ["text2image", "image2image"]\nsource = "builtin:null"\n'
        "[models.limits]\nmax_prompt_chars = 100_000\nmax_input_bytes = 1000\n"
    )
    catalog = Catalog.load([path])
    assert validate(req(model="long", prompt="x" * 50_000), catalog).request.prompt == "x" * 50_000
    image = MediaInput(role=MediaRole.IMAGE, data=b"x" * 1001)
    invalid(req(model="long", task=Task.IMAGE2IMAGE, inputs=[image]), catalog, "inputs")
    assert catalog.resolve("tiny-sd").limits.max_prompt_chars == 32_000  # the default
    # DescribeModel (and each Assignment) carries them.
    spec = catalog.resolve("long")
    assert catalog_convert.model_from_proto(catalog_convert.model_to_proto(spec)).limits == spec.limits


def test_adapter_paths_in_bounds_are_accepted(catalog: Catalog) -> None:
    adapters = [Adapter("fox"), Adapter("loras/fox", 0.5), Adapter("/models/loras/fox.safetensors")]
    assert validate(req(adapters=adapters), catalog).request.adapters == adapters


def test_a_huge_model_name_is_refused_without_echoing_it(catalog: Catalog) -> None:
    error = invalid(req(model="m" * 100_000), catalog, "model")
    assert "m" * 100 not in error.message


def test_an_unknown_model_is_quoted_bounded(catalog: Catalog) -> None:
    with pytest.raises(ModelNotFound) as info:
        validate(req(model="tiny-sd" + "x" * 200), catalog)
    assert len(info.value.message) <= MESSAGE_CHARS and "x" * 100 not in info.value.message


def test_a_big_catalog_lists_a_bounded_part_of_itself() -> None:
    catalog = Catalog([ModelSpec(id=f"model-{i:04}", tasks=[Task.TEXT2IMAGE]) for i in range(1000)])
    with pytest.raises(ModelNotFound) as info:
        validate(req(model="zzz"), catalog)
    assert "model-0000" in info.value.message and "(1000 in all)" in info.value.message
    assert len(info.value.message) <= MESSAGE_CHARS


def test_job_and_worker_ids_are_bounded_before_any_lookup(catalog: Catalog) -> None:
    engine = MemoryEngine(ControllerConfig(), catalog)
    for call, field in [
        (lambda: now(engine.get("j" * 100_000)), "job_id"),
        (lambda: now(engine.cancel("j" * 100_000)), "job_id"),
        (lambda: now(engine.artifact("j" * 100_000, 0)), "job_id"),
        (lambda: now(engine.drain_worker("w" * 100_000)), "worker_id"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            call()
        assert info.value.field == field and len(info.value.message) <= MESSAGE_CHARS
    with pytest.raises(JobNotFound) as missing:
        now(engine.get("job-" + "0" * 100))
    assert len(missing.value.message) <= MESSAGE_CHARS


def test_a_worker_named_after_its_pod_can_be_drained(catalog: Catalog) -> None:
    # Kubernetes pod names (the worker id in deploy/k8s) may have 253 characters.
    engine = MemoryEngine(ControllerConfig(), catalog)
    with pytest.raises(WorkerNotFound):
        now(engine.drain_worker("w" * 253))


def test_a_reused_idempotency_key_is_quoted_bounded(catalog: Catalog) -> None:
    engine = MemoryEngine(ControllerConfig(), catalog)
    key = "k" * 256
    submit(engine, req(idempotency_key=key))
    with pytest.raises(InvalidRequest) as info:
        submit(engine, req(idempotency_key=key, prompt="another"))
    assert info.value.field == "idempotency_key" and len(info.value.message) <= MESSAGE_CHARS


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"step_cache": {"kind": "y" * 5000}}, "extra.runtime.step_cache.kind"),
        ({"é" * 20: 1}, "extra.runtime." + "\\xe9" * 20),
        ({"a\nb": 1}, "extra.runtime.a\\nb"),
    ],
)
def test_runtime_option_errors_are_bounded_ascii(
    catalog: Catalog, runtime: dict[str, object], field: str
) -> None:
    # A field path travels in trailing metadata (printable ASCII only); a reason in the status.
    error = invalid(req(extra={"runtime": runtime}), catalog, field)
    assert error.field.isascii() and error.field.isprintable()


@pytest.mark.parametrize("key", ["width", "num_inference_steps", "guidance_scale", "strength"])
def test_extra_may_not_set_a_request_field_around_its_bounds(catalog: Catalog, key: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(req(extra={key: 100000, "eta": 0.5}), catalog)
    assert info.value.field == f"extra.{key}" and "is a request field" in str(info.value)
    assert validate(req(extra={"eta": 0.5}), catalog).request.extra == {"eta": 0.5}


def test_the_null_model_takes_no_runtime_options(catalog: Catalog) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate(req(model="null", extra={"runtime": {"enable_vae_tiling": True}}), catalog)
    assert info.value.field == "extra.runtime" and "runs no pipeline" in str(info.value)


def test_a_strength_that_leaves_no_step_is_refused(catalog: Catalog) -> None:
    image = MediaInput(role=MediaRole.IMAGE, data=b"\x89PNG\r\n\x1a\n")
    with pytest.raises(InvalidRequest) as info:
        validate(req(task=Task.IMAGE2IMAGE, inputs=[image], num_inference_steps=1, strength=0.75), catalog)
    assert info.value.field == "strength" and "no denoising step" in str(info.value)
    plan = validate(req(task=Task.IMAGE2IMAGE, inputs=[image], num_inference_steps=4, strength=0.5), catalog)
    assert plan.request.strength == 0.5


def test_every_model_takes_the_balanced_preset(catalog: Catalog) -> None:
    """The original OmniRT's default preset: a model without one of its own runs its defaults."""
    plain = validate(req(), catalog).request
    balanced = validate(req(preset="balanced"), catalog).request
    assert (balanced.num_inference_steps, balanced.guidance_scale) == (
        plain.num_inference_steps,
        plain.guidance_scale,
    )
    with pytest.raises(InvalidRequest):
        validate(req(preset="no-such-preset"), catalog)
