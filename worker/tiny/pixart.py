"""The tiny random-weight PixArt-Sigma (`builtin:tiny-pixart-sigma`), text-to-image.

A real `PixArtSigmaPipeline` with small seeded weights in the shapes diffusers' own PixArt-Sigma
tests use, built offline and saved with `save_pretrained`: a 2-layer `PixArtTransformer2DModel`
(patch 2, adaLN-single, learned sigma: 8 output channels for 4 latent ones), a 4-block VAE with
4 latent channels (8x, as the real one), a 2-layer `T5EncoderModel` of width 32 with the offline
T5 tokenizer of `tiny-wan`, and the real model's `DPMSolverMultistepScheduler`.

The transformer's `sample_size` is 32, the smallest the pipeline has an aspect-ratio table for:
its default resolution binning (on, as for the real models) generates at the nearest 256-pixel
bin and resizes to the requested size, so any requested size works without a request extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

TEXT_WIDTH = parts.TEXT_WIDTH
LATENT_CHANNELS = 4


def build_tiny_pixart_sigma(target: Path) -> None:
    """A tiny `PixArtSigmaPipeline`: generated at a 256-pixel bin, returned at the requested size."""
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.t5_encoder(tokenizer, TEXT_WIDTH)
        transformer = PixArtTransformer2DModel(
            sample_size=32,
            num_layers=2,
            patch_size=2,
            attention_head_dim=8,
            num_attention_heads=3,
            caption_channels=TEXT_WIDTH,
            in_channels=LATENT_CHANNELS,
            cross_attention_dim=24,
            # Learned sigma: a variance channel per latent channel, as the real PixArt models.
            out_channels=2 * LATENT_CHANNELS,
            attention_bias=True,
            activation_fn="gelu-approximate",
            num_embeds_ada_norm=1000,
            norm_type="ada_norm_single",
            norm_elementwise_affine=False,
            norm_eps=1e-6,
        )
        vae = parts.image_vae(LATENT_CHANNELS, sample_size=256)
    pipeline: Any = PixArtSigmaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=DPMSolverMultistepScheduler(),
    )
    pipeline.save_pretrained(str(target))
