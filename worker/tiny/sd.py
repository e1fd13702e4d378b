"""The tiny random-weight Stable Diffusion (`builtin:tiny-sd`).

A real `StableDiffusionPipeline` with small seeded weights, built offline and saved with
`save_pretrained`: a 2-block UNet with cross-attention of width 32, a 4-block VAE with
4 latent channels (64x64 images from 8x8 latents), a 2-layer CLIP text encoder of width 32
and the byte-level BPE tokenizer of `tokenizers` (no hub download), with an Euler scheduler.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts


def build_tiny_sd(target: Path) -> None:
    """A tiny Stable Diffusion: 64x64 images (8x8 latents), CLIP text encoder of width 32."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline
    from transformers import CLIPTextModel

    tokenizer = parts.clip_tokenizer()
    with parts.seeded():
        unet = parts.unet(cross_attention_dim=32, attention_head_dim=8)
        vae = parts.image_vae()
        text_encoder = CLIPTextModel(parts.clip_text_config(tokenizer))
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
