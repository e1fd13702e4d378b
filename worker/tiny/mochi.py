"""Tiny random-weight Mochi text-to-video model (`builtin:tiny-mochi`).

Like `tiny-wan`, a real diffusers `MochiPipeline` with small seeded weights, built offline and
saved with `save_pretrained`: a 1-layer `MochiTransformer3DModel` (patch 2), an
`AutoencoderKLMochi` of width 32 (its group norms take 32 groups) with Mochi's own compression
(8x spatial, 6x temporal: the pipeline hard-codes both), a 2-layer `T5EncoderModel` of width 32
with the offline T5 tokenizer, and a `FlowMatchEulerDiscreteScheduler`. Sizes are multiples of
16 (VAE 8 x patch 2) and frame counts 6k+1 (7 frames make 2 latent frames).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 12


def build_tiny_mochi(target: Path) -> None:
    """A tiny Mochi text-to-video `MochiPipeline` (sizes multiple of 16, 6k+1 frames)."""
    from diffusers import (
        AutoencoderKLMochi,
        FlowMatchEulerDiscreteScheduler,
        MochiPipeline,
        MochiTransformer3DModel,
    )

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.t5_encoder(tokenizer)
        vae = AutoencoderKLMochi(
            latent_channels=LATENT_CHANNELS,
            out_channels=3,
            encoder_block_out_channels=(32, 32, 32, 32),
            decoder_block_out_channels=(32, 32, 32, 32),
            layers_per_block=(1, 1, 1, 1, 1),
            add_attention_block=(False,) * 5,
            latents_mean=(0.0,) * LATENT_CHANNELS,
            latents_std=(1.0,) * LATENT_CHANNELS,
        )
        transformer = MochiTransformer3DModel(
            patch_size=2,
            num_attention_heads=2,
            attention_head_dim=8,
            num_layers=1,
            pooled_projection_dim=16,
            in_channels=LATENT_CHANNELS,
            out_channels=None,
            qk_norm="rms_norm",
            text_embed_dim=32,
            time_embed_dim=4,
            activation_fn="swiglu",
        )
    pipeline: Any = MochiPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipeline.save_pretrained(str(target))
