"""The tiny random-weight Qwen-Image-Edit (`builtin:tiny-qwen-image-edit`): the prompt edits the image.

A real diffusers `QwenImageEditPipeline` with small seeded weights, built offline and saved
with `save_pretrained`: the 2-layer transformer (its attention sharpened, below), 2-layer
Qwen2.5-VL (its 2-block vision tower reads the input image here) and scheduler of
`tiny-qwen-image`, a narrower VAE (below), and the
`processor` Qwen-Image-Edit ships: a transformers `Qwen2VLProcessor` folder in the released
layout (`preprocessor_config.json` naming `Qwen2VLImageProcessor`, the offline Qwen2 tokenizer's
files, `processor_config.json`), which `model_index.json` names `["transformers",
"Qwen2VLProcessor"]`. The same folder loads as `QwenImageEditPlusPipeline`.

Without torchvision the worker loads that processor as `qwen_vl_processor.ImageQwen2VLProcessor`
(transformers builds the standard one only with its video processor). The image processor's
`max_pixels` is 112x112 where Qwen2.5-VL's default allows 3584x3584: the pipeline hands the vision
tower the input resized to about 1024x1024, and here it makes 8x8 patches, 16 image tokens.

Whatever size is asked, the pipeline encodes the input image with the VAE at about 1024x1024 (its
aspect ratio kept, sides multiples of 32); the output is the asked width and height (multiples
of 16), or that 1024x1024-area size when none is asked. At that size tiny-qwen-image's VAE
encoder took 17 s of a 20 s call (one CPU thread, a shared machine): this one keeps the real 8x
factor and 4 latent channels but is 8 channels wide at every level with no residual blocks on
the way down, ~4 s (its first 3->8 channel convolution and the mid-block attention over 128x128
latents stay, both fixed by the pipeline's size).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, qwen_image, tokenizers

# The vision tower's input: Qwen2.5-VL's 14-pixel patches, merged 2x2 into one token.
PATCH_SIZE = 14
MERGE_SIZE = 2
MAX_PIXELS = (8 * PATCH_SIZE) ** 2
MIN_PIXELS = (4 * PATCH_SIZE) ** 2
ATTENTION_GAIN = 4.0


def write_processor(folder: Path) -> None:
    """Save a `Qwen2VLProcessor` folder as Qwen-Image-Edit's `processor/`, without building one
    (that needs torchvision): the PIL image processor's config, the tokenizer, the processor's."""
    from transformers import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH_SIZE, merge_size=MERGE_SIZE
    )
    image_processor.save_pretrained(str(folder))  # names `Qwen2VLImageProcessor`, as released
    tokenizers.qwen2_tokenizer().save_pretrained(str(folder))
    (folder / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2)
    )


def build_tiny_qwen_image_edit(target: Path) -> None:
    """A tiny `QwenImageEditPipeline`: edits at 64x64 by default, sizes multiple of 16."""
    import torch
    from diffusers import (
        AutoencoderKLQwenImage,
        QwenImageEditPipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2VLProcessor

    tokenizer = tokenizers.qwen2_tokenizer()
    channels = qwen_image.LATENT_CHANNELS
    # tiny-qwen-image's text encoder and transformer, in its order: the same weights.
    with parts.seeded():
        text_encoder = qwen_image._text_encoder(tokenizer)
        transformer: Any = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=4 * channels,  # a packed 2x2 patch of latents per token
            out_channels=channels,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=qwen_image.TEXT_WIDTH,
            guidance_embeds=False,
            axes_dims_rope=(8, 4, 4),  # sums to attention_head_dim
        )
    # The VAE from its own seeded RNG (the parts above leave it at another state).
    with parts.seeded():
        vae = AutoencoderKLQwenImage(
            base_dim=8,
            z_dim=channels,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=0,
            temperal_downsample=[False, True, True],  # three downsamplings: the real 8x
            latents_mean=[0.0] * channels,
            latents_std=[1.0] * channels,
        )
    # Sharper attention: its q/k RMSNorm gains at 4, not 1. Over the input's 4096 latent tokens,
    # attention with unit gains is near uniform, and another prompt moved the pixels by 0.0008 of
    # 255, another input image by 0.05; at 4, by ~0.25 each.
    with torch.no_grad():
        for block in transformer.transformer_blocks:
            for norm in (
                block.attn.norm_q,
                block.attn.norm_k,
                block.attn.norm_added_q,
                block.attn.norm_added_k,
            ):
                norm.weight.fill_(ATTENTION_GAIN)
    scheduler = qwen_image.qwen_scheduler()
    pipeline: Any = QwenImageEditPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        processor=None,
    )
    pipeline.save_pretrained(str(target))
    # The processor is saved by hand: transformers builds a `Qwen2VLProcessor` only with torchvision.
    write_processor(target / "processor")
    index_file = target / "model_index.json"
    index = json.loads(index_file.read_text())
    index["processor"] = ["transformers", Qwen2VLProcessor.__name__]
    index_file.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
