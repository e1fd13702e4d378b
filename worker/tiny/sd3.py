"""Tiny random-weight Stable Diffusion 3 text-to-image model (`builtin:tiny-sd3`).

A real diffusers `StableDiffusion3Pipeline` with small seeded weights in the shapes of
diffusers' own SD3 tests, built offline and saved with `save_pretrained`: a 1-layer
`SD3Transformer2DModel` (patch 2), an `AutoencoderKL` with SD3's 16 latent channels and
shift/scaling (8x compression), two 2-layer `CLIPTextModelWithProjection` of width 32 with
the offline CLIP tokenizer of `tiny-sd`, a 2-layer `T5EncoderModel` of width 64 with the
offline T5 tokenizer, and SD3's `FlowMatchEulerDiscreteScheduler` (shift 3). Sizes are
multiples of 16 (VAE factor 8 x patch 2); 64x64 makes 8x8 latents, 16 image tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

CLIP_WIDTH = parts.TEXT_WIDTH
# SD3's real 16 latent channels: its inpaint pipeline accepts a transformer of 16 (or 33) only.
LATENT_CHANNELS = 16
# SD3 pads the two CLIP encoders' joined hidden states (2 x 32) to T5's width and
# concatenates them with T5's tokens: T5 must be at least as wide as both CLIPs together.
T5_WIDTH = 2 * CLIP_WIDTH


def build_tiny_sd3(target: Path) -> None:
    """A tiny `StableDiffusion3Pipeline`: 64x64 images by default, sizes multiple of 16."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    tokenizer = parts.clip_tokenizer()
    tokenizer_2 = parts.clip_tokenizer()
    tokenizer_3 = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = CLIPTextModelWithProjection(parts.clip_text_config(tokenizer, CLIP_WIDTH))
        text_encoder_2 = CLIPTextModelWithProjection(parts.clip_text_config(tokenizer_2, CLIP_WIDTH))
        text_encoder_3 = parts.t5_encoder(tokenizer_3, T5_WIDTH, d_kv=16, d_ff=64)
        transformer = SD3Transformer2DModel(
            sample_size=8,
            patch_size=2,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=T5_WIDTH,
            pooled_projection_dim=2 * CLIP_WIDTH,  # both CLIPs' pooled projections, joined
            pos_embed_max_size=32,
        )
        vae = parts.image_vae(LATENT_CHANNELS, **parts.SD3_LATENTS)
    pipeline: Any = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
    pipeline.save_pretrained(str(target))
