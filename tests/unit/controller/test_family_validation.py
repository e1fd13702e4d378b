"""The controller refuses what a model's family cannot honour, naming the field, before queueing."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnirt.controller.core.catalog import Catalog, CatalogError
from omnirt.controller.core.validation import validate
from omnirt.errors import FailedPrecondition, InvalidRequest
from omnirt.types import GenerateRequest, MediaInput, MediaRole, Task

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def req(model: str, **kw: object) -> GenerateRequest:
    base: dict[str, object] = {"model": model, "prompt": "a red fox"}
    base.update(kw)
    return GenerateRequest(**base)  # type: ignore[arg-type]


def image(role: MediaRole = MediaRole.IMAGE) -> MediaInput:
    return MediaInput(role=role, data=PNG)


@pytest.mark.parametrize(
    ("model", "changes", "field", "words"),
    [
        ("flux.1-dev", {"width": 1000}, "width", "multiple of 16 for the flux family"),
        ("sana-1.6b", {"height": 1008}, "height", "multiple of 32 for the sana family"),
        ("ltx-video", {"num_frames": 160}, "num_frames", "8k+1 for the ltx-video family"),
        ("mochi-1-preview", {"num_frames": 84}, "num_frames", "6k+1"),
        ("mochi-1-preview", {"num_inference_steps": 1}, "num_inference_steps", "at least 2 for the mochi"),
        ("hunyuanvideo", {"num_frames": 128}, "num_frames", "4k+1"),
        ("svd-xt", {"inputs": [image()]}, "prompt", "svd-xt takes no prompt"),
        ("flux.2-dev", {"negative_prompt": "blurry"}, "negative_prompt", "takes no negative_prompt"),
        ("hunyuanvideo-1.5-480p-t2v", {"guidance_scale": 6.0}, "guidance_scale", "takes no guidance_scale"),
        ("sdxl", {"num_frames": 16}, "num_frames", "sdxl takes no num_frames"),
        ("sdxl", {"inputs": [image()]}, "inputs[0].role", "text2image on sdxl takes no image input"),
        (
            "sdxl",
            {"task": Task.IMAGE2IMAGE, "inputs": [image(), image(MediaRole.MASK)]},
            "inputs[1].role",
            "takes no mask input (it takes: image)",
        ),
        ("wan2.1-t2v-1.3b", {"inputs": [image()]}, "inputs[0].role", "text2video"),
    ],
)
def test_a_field_the_family_cannot_honour_is_invalid_argument(
    catalog: Catalog, model: str, changes: dict, field: str, words: str
) -> None:
    if model == "svd-xt":
        changes = {**changes, "prompt": "a red fox"}
    with pytest.raises(InvalidRequest) as info:
        validate(req(model, **changes), catalog)
    assert info.value.field == field
    assert words in info.value.message


@pytest.mark.parametrize(
    ("model", "changes"),
    [
        ("flux.1-dev", {"width": 1024, "height": 768}),
        ("ltx-video", {"num_frames": 97}),
        # Wan rounds a frame count onto its grid itself: any count is taken (the OpenAI route's
        # seconds x fps).
        ("wan2.1-t2v-1.3b", {"num_frames": 80}),
        ("svd-xt", {"prompt": "", "inputs": [image()]}),
        ("sdxl", {"task": Task.INPAINT, "inputs": [image(), image(MediaRole.MASK)]}),
        ("stable-audio-open-1.0", {}),
    ],
)
def test_what_the_family_takes_is_planned(catalog: Catalog, model: str, changes: dict) -> None:
    plan = validate(req(model, **changes), catalog)
    assert plan.spec.id == model


def test_a_model_in_a_mode_its_family_cannot_run_is_failed_precondition(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[[models]]\nid = "my-cog"\nfamily = "cogvideox"\ntasks = ["text2video"]\n'
        'execution_mode = "modular"\nsource = "builtin:tiny-cogvideox"\n'
        'pipeline_class = "CogVideoXPipeline"\n'
    )
    catalog = Catalog.load([mine])
    with pytest.raises(FailedPrecondition) as info:
        validate(req("my-cog"), catalog)
    assert info.value.field == "model"
    assert "my-cog cannot run in modular mode: the cogvideox family runs in legacy_call" in info.value.message


def test_the_low_vram_preset_sets_runtime_options_unless_the_request_has_its_own(catalog: Catalog) -> None:
    plan = validate(req("flux.1-dev", preset="low-vram"), catalog)
    assert plan.request.extra["runtime"] == {"cpu_offload": "model", "enable_vae_tiling": True}
    assert plan.request.num_inference_steps == 28, "the model's default steps stay"
    own = validate(
        req("flux.1-dev", preset="low-vram", extra={"runtime": {"enable_vae_slicing": True}}), catalog
    )
    assert own.request.extra["runtime"] == {"enable_vae_slicing": True}
    fast = validate(req("flux.1-dev", preset="fast"), catalog)
    assert fast.request.num_inference_steps == 14 and "runtime" not in fast.request.extra


def test_a_real_model_runs_in_its_familys_dtype(catalog: Catalog) -> None:
    assert catalog.resolve("flux.1-dev").runtime["dtype"] == {"cuda": "bfloat16", "ascend": "bfloat16"}
    assert catalog.resolve("sdxl").runtime["dtype"] == {"cuda": "float16", "ascend": "float16"}


def test_a_user_catalog_adds_a_family_and_its_rules(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[[families]]\nid = "my-video"\npipelines = { text2video = "MyVideoPipeline" }\n'
        'size_multiple = 64\nframe_grid = 5\nunsupported = ["negative_prompt", "duration_ms"]\n'
        'dtype = { cuda = "bfloat16" }\n\n'
        '[[models]]\nid = "my-video-1"\nfamily = "my-video"\ntasks = ["text2video"]\n'
        'source = "/models/my-video"\npipeline_class = "MyVideoPipeline"\n'
    )
    catalog = Catalog.load([mine])
    assert catalog.resolve("my-video-1").runtime["dtype"] == {"cuda": "bfloat16"}
    assert validate(req("my-video-1", width=128, height=64, num_frames=11), catalog).request.num_frames == 11
    for changes, field in (({"width": 96}, "width"), ({"num_frames": 12}, "num_frames")):
        with pytest.raises(InvalidRequest) as info:
            validate(req("my-video-1", **changes), catalog)
        assert info.value.field == field


def test_a_malformed_family_or_preset_in_a_catalog_file_is_a_catalog_error(tmp_path: Path) -> None:
    bad_family = tmp_path / "family.toml"
    bad_family.write_text('[[families]]\nid = "f"\npipelines = { text2image = "P" }\nframe_grid = -1\n')
    with pytest.raises(CatalogError, match=r"family 'f': `frame_grid` must be"):
        Catalog.load([bad_family])
    bad_preset = tmp_path / "preset.toml"
    bad_preset.write_text('[[models]]\nid = "m"\ntasks = ["text2image"]\n[models.presets.turbo]\nsteps = 2\n')
    with pytest.raises(CatalogError, match=r"preset 'turbo': unknown keys \['steps'\]"):
        Catalog.load([bad_preset])


def test_a_step_cache_for_a_family_whose_denoiser_takes_no_hooks_is_refused(catalog: Catalog) -> None:
    cache = {"runtime": {"step_cache": "first_block"}}
    with pytest.raises(InvalidRequest) as info:
        validate(req("sd3.5-large", extra=cache), catalog)
    assert info.value.field == "extra.runtime.step_cache"
    assert "sd3 family's denoiser takes no diffusers cache hooks" in info.value.message
    assert validate(req("flux.1-dev", extra=cache), catalog).request.extra["runtime"]["step_cache"]


def test_a_task_the_modular_blocks_do_not_run_is_failed_precondition(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[[models]]\nid = "my-flux"\nfamily = "flux"\ntasks = ["text2image", "inpaint"]\n'
        'execution_mode = "modular"\nsource = "builtin:tiny-flux"\npipeline_class = "FluxPipeline"\n'
    )
    catalog = Catalog.load([mine])
    assert validate(req("my-flux"), catalog).request.task is Task.TEXT2IMAGE
    inpaint = {"task": Task.INPAINT, "inputs": [image(), image(MediaRole.MASK)]}
    with pytest.raises(FailedPrecondition) as info:
        validate(req("my-flux", **inpaint), catalog)
    assert info.value.field == "task"
    assert "cannot run inpaint in modular mode" in info.value.message


def test_persistent_worker_takes_its_familys_parallel_kinds_and_media_tasks_in_its_pipeline_program(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        '[[models]]\nid = "my-sd3-ring"\nfamily = "sd3"\ntasks = ["text2image", "image2image"]\n'
        'execution_mode = "persistent_worker"\nsource = "builtin:tiny-sd3"\n'
        'pipeline_class = "StableDiffusion3Pipeline"\n[models.runtime]\nparallel = "ring"\n'
    )
    mine.write_text(
        mine.read_text()
        + '\n[[models]]\nid = "my-sd3-cfg"\nfamily = "sd3"\ntasks = ["text2image", "image2image"]\n'
        'execution_mode = "persistent_worker"\nsource = "builtin:tiny-sd3"\n'
        'pipeline_class = "StableDiffusion3Pipeline"\n[models.runtime]\nparallel = "cfg"\n'
        '\n[[models]]\nid = "my-sd-loop"\nfamily = "sd"\ntasks = ["text2image", "image2image"]\n'
        'execution_mode = "persistent_worker"\nsource = "builtin:tiny-sd"\n'
        'pipeline_class = "StableDiffusionPipeline"\n'
    )
    catalog = Catalog.load([mine])
    assert validate(req("tiny-wan-ulysses2"), catalog).spec.runtime["parallel"] == "ulysses"
    assert validate(req("my-sd3-cfg"), catalog).request.task is Task.TEXT2IMAGE
    with pytest.raises(FailedPrecondition) as info:
        validate(req("my-sd3-ring"), catalog)
    assert info.value.field == "model" and "'ring' is not one the sd3 family runs" in info.value.message
    # The pipeline program (any runtime.parallel) runs media tasks; the SD loops do not.
    assert validate(req("my-sd3-cfg", task=Task.IMAGE2IMAGE, inputs=[image()]), catalog).request.task is (
        Task.IMAGE2IMAGE
    )
    with pytest.raises(FailedPrecondition) as info:
        validate(req("my-sd-loop", task=Task.IMAGE2IMAGE, inputs=[image()]), catalog)
    assert info.value.field == "task" and "text-to-X tasks only (not image2image" in info.value.message
