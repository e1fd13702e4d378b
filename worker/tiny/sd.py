"""The tiny random-weight Stable Diffusion (`builtin:tiny-sd`) and its CLIP tokenizer files.

A real `StableDiffusionPipeline` with small seeded weights, built offline and saved with
`save_pretrained`: a 2-block UNet with cross-attention of width 32, a 4-block VAE with
4 latent channels (64x64 images from 8x8 latents), a 2-layer CLIP text encoder of width 32
and a byte-level BPE tokenizer written here (no hub download), with an Euler scheduler.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers


def build_tiny_sd(target: Path) -> None:
    """A tiny Stable Diffusion: 64x64 images (8x8 latents), CLIP text encoder of width 32."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    with tempfile.TemporaryDirectory() as vocab_dir:
        tokenizers.write_clip_tokenizer_files(Path(vocab_dir))
        tokenizer = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)

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
            cross_attention_dim=32,
            attention_head_dim=8,
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
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=77,
                projection_dim=32,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
    )
    pipeline: Any = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(target))
