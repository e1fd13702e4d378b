"""The tiny random-weight Lumina-Image 2.0 (`builtin:tiny-lumina2`), text-to-image.

A real `Lumina2Pipeline` with small seeded weights in the shapes diffusers' own Lumina2 tests use,
built offline and saved with `save_pretrained`: a 2-layer `Lumina2Transformer2DModel` (width 8,
patch 2), a 4-block `AutoencoderKL` with 4 latent channels (8x, the factor the pipeline assumes),
a 2-layer `Gemma2Model` of width 8 (the pipeline reads its second-to-last hidden states) with the
offline Gemma tokenizer, and a `FlowMatchEulerDiscreteScheduler`. Sizes are multiples of 16
(VAE factor 8 x patch 2); the transformer's `sample_size` 8 makes the default size 64x64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

TEXT_WIDTH = 8
LATENT_CHANNELS = 4


def build_tiny_lumina2(target: Path) -> None:
    """A tiny `Lumina2Pipeline` (sizes multiple of 16)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    tokenizer = tokenizers.gemma_tokenizer()
    with parts.seeded():
        transformer = Lumina2Transformer2DModel(
            sample_size=8,
            patch_size=2,
            in_channels=LATENT_CHANNELS,
            hidden_size=8,
            num_layers=2,
            num_attention_heads=1,
            num_kv_heads=1,
            multiple_of=16,
            ffn_dim_multiplier=None,
            norm_eps=1e-5,
            scaling_factor=1.0,
            axes_dim_rope=(4, 2, 2),
            cap_feat_dim=TEXT_WIDTH,
        )
        vae = parts.image_vae(
            LATENT_CHANNELS, block_out_channels=(8, 8, 8, 8), sample_size=32, **parts.SD3_LATENTS
        )
        text_encoder = parts.gemma2_encoder(
            tokenizer, TEXT_WIDTH, 2, heads=4, head_dim=2, intermediate_size=37
        )
    pipeline: Any = Lumina2Pipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipeline.save_pretrained(str(target))
