"""The tiny random-weight Stable Diffusion XL (`builtin:tiny-sdxl`), text-to-image and image-to-image.

A real `StableDiffusionXLPipeline` with small seeded weights in the shapes diffusers' own SDXL
tests use, built offline and saved with `save_pretrained`: a 2-block UNet with SDXL's
`text_time` added conditioning (the pooled text embedding and the 6 size/crop micro-conditions),
a 4-block VAE with 4 latent channels (64x64 images from 8x8 latents, the real 8x factor), and
the two CLIP text encoders SDXL concatenates (a `CLIPTextModel` and a `CLIPTextModelWithProjection`,
each 2 layers of width 32) with the offline CLIP tokenizer of `tiny-sd`, and an Euler scheduler.
Image-to-image is diffusers' `StableDiffusionXLImg2ImgPipeline` on the same modules (`from_pipe`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers

TEXT_WIDTH = 32
# SDXL's added time ids: original size, crop top-left and target size, 2 numbers each.
TIME_IDS = 6
TIME_EMBED_DIM = 8


def build_tiny_sdxl(target: Path) -> None:
    """A tiny Stable Diffusion XL: 64x64 images (8x8 latents), two CLIP text encoders of width 32."""
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    with tempfile.TemporaryDirectory() as vocab_dir:
        tokenizers.write_clip_tokenizer_files(Path(vocab_dir))
        tokenizer = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)
    text_config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_WIDTH,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=TEXT_WIDTH,
        hidden_act="gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # Seeded on a forked RNG: identical weights everywhere, the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            attention_head_dim=(2, 4),
            use_linear_projection=True,
            transformer_layers_per_block=(1, 2),
            # The two encoders' hidden states are concatenated: 32 + 32.
            cross_attention_dim=2 * TEXT_WIDTH,
            addition_embed_type="text_time",
            addition_time_embed_dim=TIME_EMBED_DIM,
            # The time ids' embeddings and the second encoder's pooled projection.
            projection_class_embeddings_input_dim=TIME_IDS * TIME_EMBED_DIM + TEXT_WIDTH,
            norm_num_groups=32,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
        )
        text_encoder = CLIPTextModel(text_config)
        text_encoder_2 = CLIPTextModelWithProjection(text_config)
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
    )
    pipeline: Any = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=scheduler,
        image_encoder=None,
        feature_extractor=None,
    )
    pipeline.save_pretrained(str(target))
