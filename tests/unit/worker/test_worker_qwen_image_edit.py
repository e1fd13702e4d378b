"""Qwen-Image-Edit image2image through the legacy_call executor (`tiny-qwen-image-edit`).

The edit pipelines take a transformers `Qwen2VLProcessor`, which transformers builds only with
torchvision (for a video processor the pipelines never use); this worker has none, so it loads
the checkpoint's processor folder as `ImageQwen2VLProcessor`. These tests check that processor
against the computation `Qwen2VLProcessor` does for text and images (the PIL image processor, the
image pads expanded to the image's token count, the tokenizer), then the edit itself: the input
image and the prompt both reach the model, the output is the asked size. They run with or
without torchvision (with it, the edits load the checkpoint's own processor).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from worker_testing import (
    IMAGE,
    Family,
    check_image,
    check_seeded,
    noise_image,
    only_result,
    pixel_difference,
    png_bytes,
    refusal,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines import qwen_vl_processor
from omnirt.worker.pipelines.qwen_vl_processor import ImageQwen2VLProcessor
from omnirt.worker.tiny import qwen_image_edit
from omnirt.worker.tiny.registry import ensure_builtin

# 64x64 out; the pipeline encodes the input at about 1024x1024 whatever the size. 2 steps,
# guidance 1 (no second, unconditional, denoiser call), to keep each call a few seconds.
EDIT = Family(
    "tiny-qwen-image-edit",
    "QwenImageEditPipeline",
    (t.Task.IMAGE2IMAGE,),
    {"width": 64, "height": 64, "num_inference_steps": 2, "guidance_scale": 1.0, "seed": 7},
)
PLUS = Family("tiny-qwen-image-edit", "QwenImageEditPlusPipeline", EDIT.tasks, EDIT.defaults)
NOISE = png_bytes(noise_image(3))
RED = png_bytes(Image.new("RGB", (64, 64), "red"))


def run(
    executor: LegacyCallExecutor, image: bytes = NOISE, family: Family = EDIT, **fields: object
) -> ItemOutcome:
    return run_family(executor, family, inputs=((IMAGE, image),) if image else (), **fields)


@pytest.fixture(scope="module")
def edits(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """A noise image edited with seed 7 twice, seed 8, at 96x64, another prompt; a red image."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "wide": only_result(run(executor, width=96)),
        "other-prompt": only_result(run(executor, prompt="a blue boat")),
        "red": only_result(run(executor, RED)),
    }


def test_the_processor_makes_what_qwen2vl_processor_makes_for_text_and_images(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor

    qwen_image_edit.write_processor(tmp_path)
    processor = ImageQwen2VLProcessor.from_pretrained(tmp_path)
    assert isinstance(processor, Qwen2VLProcessor) and not hasattr(processor, "video_processor")
    texts = [
        "<|vision_start|><|image_pad|><|vision_end|>a red fox",
        "make it night <|vision_start|><|image_pad|><|vision_end|> and add a moon over the sea",
    ]
    images = [noise_image(1, (200, 120)), noise_image(2, (64, 64))]
    made = processor(text=texts, images=images, padding=True, return_tensors="pt")

    # Qwen2VLProcessor's computation: the image processor's patches, each image's pad token
    # repeated once per merged patch (grid t*h*w / merge_size^2), then the tokenizer.
    image_processor = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    pixels = image_processor(images=images, return_tensors="pt")
    counts = [int(grid.prod()) // image_processor.merge_size**2 for grid in pixels["image_grid_thw"]]
    expanded = [
        text.replace("<|image_pad|>", "<|image_pad|>" * count)
        for text, count in zip(texts, counts, strict=True)
    ]
    expected = tokenizer(expanded, padding=True, return_tensors="pt")
    assert counts[0] != counts[1] and min(counts) > 1, "two sizes, several tokens each"
    assert torch.equal(made["input_ids"], expected["input_ids"])
    assert torch.equal(made["attention_mask"], expected["attention_mask"])
    assert torch.equal(made["image_grid_thw"], pixels["image_grid_thw"])
    assert torch.equal(made["pixel_values"], pixels["pixel_values"])
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert [int((row == pad).sum()) for row in made["input_ids"]] == counts


def test_only_components_saved_as_qwen2vl_processor_are_replaced(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from diffusers import Kandinsky5T2VPipeline, QwenImageEditPipeline

    folder = ensure_builtin(EDIT.model, model_dir)
    # With torchvision the checkpoint's own processor loads: nothing is replaced.
    monkeypatch.setattr(qwen_vl_processor, "torchvision_available", lambda: True)
    assert qwen_vl_processor.processor_kwargs(QwenImageEditPipeline, str(folder)) == {}
    # Without it (this worker's install), the processor is the image-only one; held here
    # whether or not this machine has torchvision.
    monkeypatch.setattr(qwen_vl_processor, "torchvision_available", lambda: False)
    [processor] = qwen_vl_processor.processor_kwargs(QwenImageEditPipeline, str(folder)).values()
    assert isinstance(processor, ImageQwen2VLProcessor)
    # Kandinsky 5 declares its `tokenizer` a Qwen2VLProcessor; a folder that saved a plain
    # tokenizer there keeps it.
    (tmp_path / "model_index.json").write_text(json.dumps({"tokenizer": ["transformers", "Qwen2Tokenizer"]}))
    assert qwen_vl_processor.processor_kwargs(Kandinsky5T2VPipeline, str(tmp_path)) == {}


def test_the_edit_runs_the_edit_pipeline_at_the_requested_size(edits: dict[str, t.GenerateResult]) -> None:
    result = edits["first"]
    check_image(result.artifacts[0], 64, 64)
    assert (result.report.task, result.report.pipeline_class) == (t.Task.IMAGE2IMAGE, "QwenImageEditPipeline")
    # Not the input's size: the pipeline makes the asked one.
    check_image(edits["wide"].artifacts[0], 96, 64)


def test_same_seed_same_bytes_other_seed_other_image(edits: dict[str, t.GenerateResult]) -> None:
    check_seeded(edits)


def test_the_input_image_and_the_prompt_make_the_edit(edits: dict[str, t.GenerateResult]) -> None:
    # Random tiny weights: another input image moves pixels by ~0.25 of 255, another prompt by
    # ~0.26 (a seed by ~5); where either did not reach the model, by 0.
    assert pixel_difference(edits["first"], edits["red"]) > 0.1, "the input image reaches the model"
    assert pixel_difference(edits["first"], edits["other-prompt"]) > 0.1, "the prompt reaches the model"


def test_the_edit_template_prefix_is_the_count_the_pipeline_drops(model_dir: Path) -> None:
    from diffusers import QwenImageEditPipeline

    folder = ensure_builtin(EDIT.model, model_dir)
    pipeline = QwenImageEditPipeline.from_pretrained(
        folder, **qwen_vl_processor.processor_kwargs(QwenImageEditPipeline, str(folder))
    )
    prefix = pipeline.prompt_template_encode.split("<|vision_start|>")[0]
    assert len(pipeline.tokenizer(prefix)["input_ids"]) == pipeline.prompt_template_encode_start_idx


def test_an_edit_without_its_image_is_refused_naming_the_field(executor: LegacyCallExecutor) -> None:
    # The edit pipeline's `image` is optional in its signature, and None fails inside the call:
    # the worker refuses the job by its task (one sent past the controller), the controller too.
    assert refusal(run(executor, b"")) == ("INVALID_ARGUMENT", "inputs")
    from omnirt.controller.core.catalog import Catalog
    from omnirt.controller.core.validation import validate
    from omnirt.errors import InvalidRequest

    request = t.GenerateRequest(model=EDIT.model, prompt="make it night", task=t.Task.IMAGE2IMAGE)
    with pytest.raises(InvalidRequest) as info:
        validate(request, Catalog.load())
    assert info.value.field == "inputs" and "role image" in info.value.message


def test_edit_plus_loads_the_same_folder(
    executor: LegacyCallExecutor, edits: dict[str, t.GenerateResult]
) -> None:
    result = only_result(run(executor, family=PLUS))
    check_image(result.artifacts[0], 64, 64)
    assert result.report.pipeline_class == "QwenImageEditPlusPipeline"
