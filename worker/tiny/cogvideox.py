"""Tiny random-weight CogVideoX text-to-video model (`builtin:tiny-cogvideox`).

Like `tiny-wan`, a real diffusers `CogVideoXPipeline` with small seeded weights, built offline
and saved with `save_pretrained`: a 1-layer `CogVideoXTransformer3DModel` (int `patch_size` 2,
sin-cos positional embeddings recomputed for any size), an `AutoencoderKLCogVideoX` with 4
latent channels (8x spatial, 4x temporal compression), a 2-layer `T5EncoderModel` of width 32
with the offline T5 tokenizer of `tiny-wan`, and a `CogVideoXDDIMScheduler` configured like
CogVideoX-2b's. Sizes are multiples of 16 (VAE factor 8 x patch 2); 9 frames make 3 latent frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 4
# The pipeline pads every prompt to its default `max_sequence_length` (226) and the
# transformer's joint positional embedding must be at least that long.
MAX_TEXT_TOKENS = 226


def build_tiny_cogvideox(target: Path) -> None:
    """A tiny CogVideoX text-to-video `CogVideoXPipeline` (sizes multiple of 16)."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.t5_encoder(tokenizer)
        vae = AutoencoderKLCogVideoX(
            down_block_types=("CogVideoXDownBlock3D",) * 4,
            up_block_types=("CogVideoXUpBlock3D",) * 4,
            block_out_channels=(8, 8, 8, 8),
            latent_channels=LATENT_CHANNELS,
            layers_per_block=1,
            norm_num_groups=2,
            temporal_compression_ratio=4,
        )
        transformer = CogVideoXTransformer3DModel(
            num_attention_heads=2,
            attention_head_dim=16,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            time_embed_dim=8,
            text_embed_dim=32,
            num_layers=1,
            sample_width=8,
            sample_height=8,
            sample_frames=9,
            patch_size=2,
            temporal_compression_ratio=4,
            max_text_seq_length=MAX_TEXT_TOKENS,
        )
    scheduler = CogVideoXDDIMScheduler(
        beta_schedule="scaled_linear",
        clip_sample=False,
        prediction_type="v_prediction",
        rescale_betas_zero_snr=True,
        set_alpha_to_one=True,
        snr_shift_scale=3.0,
        timestep_spacing="trailing",
    )
    pipeline: Any = CogVideoXPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )
    pipeline.save_pretrained(str(target))
