"""The family table and the built-in catalog, checked against diffusers itself.

Every family's pipeline classes exist in the installed diffusers; a field the table says a
family cannot honour is one no pipeline of the family takes, and every other field is taken by
one; every catalog model's class, tasks, defaults, presets and limits agree with its family.
A family of transformers text-to-speech models (`vits`) is checked against transformers: its
classes exist there, and the fields are those the worker's wrapper of them
(`omnirt.worker.pipelines.speech`) takes.
"""

from __future__ import annotations

import inspect

import diffusers
import pytest
import transformers

from omnirt._internal import families, runtime_schema
from omnirt._internal.defaults import PRESET_FIELDS
from omnirt._internal.families import Family, FamilyError
from omnirt.controller.core.catalog import PRESET_RUNTIME, Catalog
from omnirt.types import ModelSpec, Task
from omnirt.worker.pipelines import speech

FAMILIES = families.builtin()
CATALOG = Catalog.load()
# A request field -> the names a pipeline may take it under (the worker's CALL_ARGUMENTS).
FIELD_NAMES = {
    "prompt": ("prompt",),
    "negative_prompt": ("negative_prompt",),
    "guidance_scale": ("guidance_scale", "max_guidance_scale", "true_cfg_scale"),
    "num_frames": ("num_frames",),
    "duration_ms": ("audio_end_in_s", "audio_length_in_s"),
    "num_inference_steps": ("num_inference_steps",),
    "width": ("width",),
    "height": ("height",),
}
# Fields every diffusion pipeline but an audio one takes; a diffusers family may leave them off
# its `unsupported` list (the worker drops an audio pipeline's size); a TTS family lists them.
DIFFUSION_FIELDS = ("num_inference_steps", "width", "height")
VIDEO = {Task.TEXT2VIDEO, Task.IMAGE2VIDEO}
AUDIO = {Task.TEXT2AUDIO}
# The families the issue names: each has a table and at least one real catalog model.
EXPECTED = {
    "sd", "sdxl", "sd3", "flux", "flux2", "qwen-image", "qwen-image-edit", "pixart-sigma", "sana",
    "lumina2", "hidream", "kolors", "wan", "wan2.2-ti2v", "skyreels-v2", "hunyuan-video",
    "hunyuan-video-1.5", "cogvideox", "ltx-video", "mochi", "svd", "kandinsky5", "stable-audio",
}  # fmt: skip


def is_transformers(family: Family) -> bool:
    """A family of transformers TTS models, which the worker calls through its speech wrapper."""
    return all(speech.is_speech_class(cls) for cls in family.pipelines.values())


def parameters(cls_name: str) -> frozenset[str]:
    if speech.is_speech_class(cls_name):  # what takes a request's fields is the worker's wrapper
        return frozenset(inspect.signature(speech.wrapper_class(cls_name).__call__).parameters)
    cls = getattr(diffusers, cls_name)
    return frozenset(inspect.signature(cls.__call__).parameters)


def family_takes(family: Family, field: str) -> bool:
    return any(name in parameters(cls) for cls in family.pipelines.values() for name in FIELD_NAMES[field])


def models() -> list[ModelSpec]:
    return [spec for spec in CATALOG if spec.family in FAMILIES]


def test_every_family_the_issue_names_has_a_table_and_a_real_model() -> None:
    assert set(FAMILIES) >= EXPECTED
    hub_families = {spec.family for spec in models() if not spec.source.startswith("builtin:")}
    assert hub_families >= EXPECTED, sorted(EXPECTED - hub_families)


@pytest.mark.parametrize("family", sorted(FAMILIES.values(), key=lambda f: f.id), ids=lambda f: f.id)
def test_the_family_table_matches_the_pipelines_signatures(family: Family) -> None:
    for cls_name in family.pipelines.values():
        if speech.is_speech_class(cls_name):
            cls = getattr(transformers, cls_name, None)
            assert isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel), cls_name
            continue
        cls = getattr(diffusers, cls_name, None)
        assert isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline), cls_name
    assert is_transformers(family) or not any(speech.is_speech_class(c) for c in family.pipelines.values())
    tasks = set(family.tasks)
    for field in families.REFUSABLE_FIELDS:
        applies = (field != "num_frames" or tasks & VIDEO) and (field != "duration_ms" or tasks & AUDIO)
        if field in family.unsupported:
            assert not family_takes(family, field), f"{family.id}: a pipeline takes {field}"
        elif field in DIFFUSION_FIELDS and not is_transformers(family):
            continue
        elif applies:
            assert family_takes(family, field), (
                f"{family.id}: no pipeline takes {field}; list it as unsupported"
            )
        else:
            assert field in family.unsupported, f"{family.id}: {field} does not apply; list it as unsupported"
    assert bool(family.frame_grid or family.rounds_frames) <= bool(tasks & VIDEO)
    for task in family.tasks:
        if task in {Task.IMAGE2IMAGE, Task.INPAINT, Task.IMAGE2VIDEO}:
            assert "image" in parameters(family.pipelines[task]), f"{family.id} {task}: no image argument"
        if task is Task.INPAINT:
            assert "mask_image" in parameters(family.pipelines[task])


def denoiser_class(cls_name: str) -> type | None:
    """The class of the pipeline's transformer (or UNet), from its `__init__` annotation."""
    from typing import get_args, get_type_hints

    init = getattr(diffusers, cls_name).__init__
    for name in ("transformer", "unet"):
        if name in inspect.signature(init).parameters:
            hint = get_type_hints(init).get(name)
            options = [hint, *get_args(hint)]  # `WanTransformer3DModel | None` too
            return next((h for h in options if isinstance(h, type) and h is not type(None)), None)
    return None


@pytest.mark.parametrize("family", sorted(FAMILIES.values(), key=lambda f: f.id), ids=lambda f: f.id)
def test_step_cache_is_said_of_the_families_whose_denoiser_takes_cache_hooks(family: Family) -> None:
    from diffusers.models.cache_utils import CacheMixin

    if is_transformers(family):  # no diffusers denoiser: the worker refuses a step cache
        assert not family.step_cache, family.id
        return
    classes = {denoiser_class(cls) for cls in family.pipelines.values()}
    assert None not in classes, family.id
    takes = {issubclass(c, CacheMixin) for c in classes if c is not None}
    assert takes == {family.step_cache}, (family.id, classes)


@pytest.mark.parametrize("spec", models(), ids=lambda s: s.id)
def test_every_catalog_model_agrees_with_its_family(spec: ModelSpec) -> None:
    family = FAMILIES[spec.family]
    assert set(spec.tasks) <= set(family.tasks), f"{spec.id}: tasks its family has no pipeline for"
    assert spec.pipeline_class in family.pipelines.values()
    assert spec.execution_mode in family.modes
    d, lim = spec.defaults, spec.limits
    for size, most in ((d.width, lim.max_width), (d.height, lim.max_height)):
        assert size % family.size_multiple == 0 and (not most or size <= most)
        assert not most or most % family.size_multiple == 0
    assert not d.num_frames or (family.on_frame_grid(d.num_frames) and d.num_frames <= lim.max_num_frames)
    assert not lim.max_inference_steps or d.num_inference_steps <= lim.max_inference_steps
    if not spec.source.startswith("builtin:") and is_transformers(family):
        assert not d.num_inference_steps and not spec.presets, f"{spec.id}: a TTS model runs no steps"
    elif not spec.source.startswith("builtin:"):
        assert d.num_inference_steps, f"{spec.id}: a real model states its steps"
        assert {"fast", "quality", "low-vram"} <= {p.name for p in spec.presets}
    if not spec.source.startswith("builtin:"):
        assert spec.runtime["dtype"] == dict(family.dtype), "the family's dtype per backend"
    for preset in spec.presets:
        assert set(preset.overrides) <= {*PRESET_FIELDS, PRESET_RUNTIME}
        steps = preset.overrides.get("num_inference_steps", 0)
        assert not lim.max_inference_steps or steps <= lim.max_inference_steps
        if PRESET_RUNTIME in preset.overrides:
            runtime_schema.request_options(preset.overrides[PRESET_RUNTIME], spec.runtime)
            if preset.overrides[PRESET_RUNTIME].get("enable_vae_tiling"):
                assert "vae_tiling" in family.offload, f"{spec.id}: its family's VAE does not tile"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"id": "x"}, "`pipelines` must map"),
        ({"id": "x", "pipelines": {"text2sound": "P"}}, "'text2sound' is not a task"),
        ({"id": "x", "pipelines": {"text2image": "P"}, "unsupported": ["seed"]}, "'seed' is not one of"),
        ({"id": "x", "pipelines": {"text2image": "P"}, "size_multiple": 0}, "at least 1"),
        ({"id": "x", "pipelines": {"text2image": "P"}, "dtype": {"cuda": "fp8"}}, "`dtype` maps"),
        ({"id": "x", "pipelines": {"text2image": "P"}, "colour": "red"}, "unknown keys ['colour']"),
    ],
)
def test_a_malformed_family_table_names_the_family_and_key(table: dict, message: str) -> None:
    with pytest.raises(FamilyError, match=r"family 'x'|every family") as info:
        families.family_from_dict(table, "mine.toml")
    assert message in str(info.value)


# The pipeline config of families whose checkpoints load as another family's class: Wan 2.2's
# two experts (`boundary_ratio`, run on the Wan 2.2 blocks) and TI2V (`expand_timesteps`,
# refused) load as `WanPipeline` and `WanImageToVideoPipeline`.
CHECKPOINT_CONFIGS: dict[str, dict[str, object]] = {
    "wan2.2": {"boundary_ratio": 0.875},
    "wan2.2-ti2v": {"expand_timesteps": True},
}


@pytest.mark.parametrize("family", sorted(FAMILIES.values(), key=lambda f: f.id), ids=lambda f: f.id)
def test_the_modular_tasks_are_the_ones_the_worker_runs(family: Family) -> None:
    from omnirt.worker.modes.modular.families import modular_family

    runs = set()
    for task, cls in family.pipelines.items():
        config = CHECKPOINT_CONFIGS.get(family.id, {})
        blocks = modular_family(cls, config)
        if blocks is not None and task in blocks.tasks and not blocks.refused(config):
            runs.add(task)
    assert set(family.modular) == runs
    assert ("modular" in family.modes) == bool(family.modular)
