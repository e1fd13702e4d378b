"""Tiny random-weight Flux.1 text-to-image model (`builtin:tiny-flux`).

A real diffusers `FluxPipeline` with small seeded weights in the shapes of diffusers' own Flux
tests, built offline and saved with `save_pretrained`: a `FluxTransformer2DModel` with one
double-stream and one single-stream block and guidance embedding (as FLUX.1-dev, so the
request's guidance_scale reaches the model), an `AutoencoderKL` with 4 latent channels and
Flux's shift/scaling (8x compression), a 2-layer `CLIPTextModel` of width 32 with the offline
CLIP tokenizer of `tiny-sd`, a 2-layer `T5EncoderModel` of width 32 with the offline T5
tokenizer, and FLUX.1-dev's dynamically shifted `FlowMatchEulerDiscreteScheduler`.

The pipeline packs 2x2 latent patches into one token (the transformer's own `patch_size` is 1):
sizes are multiples of 16 (VAE factor 8 x 2); 64x64 makes 8x8 latents, 16 image tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 4
WIDTH = 32


def build_tiny_flux(target: Path) -> None:
    """A tiny `FluxPipeline`: 64x64 images by default, sizes multiple of 16."""
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tokenizer = parts.clip_tokenizer()
    tokenizer_2 = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = CLIPTextModel(parts.clip_text_config(tokenizer, WIDTH))
        text_encoder_2 = parts.t5_encoder(tokenizer_2, WIDTH)
        transformer = FluxTransformer2DModel(
            patch_size=1,
            in_channels=4 * LATENT_CHANNELS,  # a packed 2x2 patch of latents per token
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=WIDTH,  # T5's hidden states
            pooled_projection_dim=WIDTH,  # CLIP's pooled output
            guidance_embeds=True,
            axes_dims_rope=(4, 4, 8),  # sums to attention_head_dim
        )
        vae = parts.image_vae(LATENT_CHANNELS, **parts.FLUX_LATENTS)
    pipeline: Any = FluxPipeline(
        scheduler=parts.flux_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    pipeline.save_pretrained(str(target))
