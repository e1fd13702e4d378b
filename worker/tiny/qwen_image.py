"""The tiny random-weight Qwen-Image (`builtin:tiny-qwen-image`), text-to-image and image-to-image.

A real diffusers `QwenImagePipeline` with small seeded weights in the shapes of diffusers' own
Qwen-Image tests, built offline and saved with `save_pretrained`: a 2-layer
`QwenImageTransformer2DModel` (patch 2, not guidance-distilled, as Qwen/Qwen-Image), an
`AutoencoderKLQwenImage` with 4 latent channels and the real 8x spatial factor (three
downsamplings), a 2-layer `Qwen2_5_VLForConditionalGeneration` of width 32 (the pipeline reads its
last hidden states; its vision tower is there, unused by text-to-image) with the offline Qwen2
tokenizer, and Qwen-Image's dynamically shifted `FlowMatchEulerDiscreteScheduler`.

Sizes are multiples of 16 (VAE factor 8 x the 2x2 latent packing); 64x64 makes 8x8 latents, 16
image tokens. Image-to-image and inpaint are diffusers' `QwenImageImg2ImgPipeline` and
`QwenImageInpaintPipeline` on the same modules (`from_pipe`). Classifier-free guidance is
Qwen-Image's `true_cfg_scale` with a negative prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

TEXT_WIDTH = 32
LATENT_CHANNELS = 4


def _text_encoder(tokenizer: Any) -> Any:
    """A 2-layer Qwen2.5-VL of width 32 whose special ids are the offline tokenizer's."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in tokenizers.QWEN2_SPECIALS}
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 2 * TEXT_WIDTH,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            # Multimodal RoPE: the sections (time, height, width) split half the head width, 16 / 2.
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e6},
            "bos_token_id": ids["<|endoftext|>"],
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
        },
        vision_config={
            "depth": 2,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": TEXT_WIDTH,
            "fullatt_block_indexes": [1],
        },
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def build_tiny_qwen_image(target: Path) -> None:
    """A tiny `QwenImagePipeline`: 64x64 images by default, sizes multiple of 16."""
    from diffusers import (
        AutoencoderKLQwenImage,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    tokenizer = tokenizers.qwen2_tokenizer()
    with parts.seeded():
        text_encoder = _text_encoder(tokenizer)
        transformer = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=4 * LATENT_CHANNELS,  # a packed 2x2 patch of latents per token
            out_channels=LATENT_CHANNELS,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=TEXT_WIDTH,
            guidance_embeds=False,
            axes_dims_rope=(8, 4, 4),  # sums to attention_head_dim
        )
        vae = AutoencoderKLQwenImage(
            base_dim=8,
            z_dim=LATENT_CHANNELS,
            dim_mult=[1, 2, 4, 4],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],  # three downsamplings: the real 8x
            latents_mean=[0.0] * LATENT_CHANNELS,
            latents_std=[1.0] * LATENT_CHANNELS,
        )
    scheduler = qwen_scheduler()
    pipeline: Any = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipeline.save_pretrained(str(target))


def qwen_scheduler() -> Any:
    """Qwen/Qwen-Image's scheduler config (Qwen-Image-Edit's too)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        shift=1.0,
        shift_terminal=0.02,
        use_dynamic_shifting=True,
        time_shift_type="exponential",
    )
