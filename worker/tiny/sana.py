"""The tiny random-weight Sana (`builtin:tiny-sana`), text-to-image.

A real `SanaPipeline` with small seeded weights in the shapes diffusers' own Sana tests use, built
offline and saved with `save_pretrained`: a 1-layer `SanaTransformer2DModel` (linear attention,
patch 1), a 6-block `AutoencoderDC` of width 8 with 4 latent channels (32x, as the real one),
a 1-layer `Gemma2Model` of width 8 with the offline Gemma tokenizer, and a
`FlowMatchEulerDiscreteScheduler` with shift 7 as the tests use.

The transformer's `sample_size` is 16, the smallest the pipeline has an aspect-ratio table for: its
default resolution binning (on, as for the real models) generates at the nearest 512-pixel bin
(16x16 latents) and resizes to the requested size, so any requested size works.
The pipeline's default complex human instruction (a long English preamble) is kept: the tokenizer
encodes any text, falling back to bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

TEXT_WIDTH = 8
LATENT_CHANNELS = 4
# Six blocks compress 32x, as the real DC-AE: the 512-pixel bin is 16x16 latents.
BLOCK_TYPES = ("ResBlock",) * 5 + ("EfficientViTBlock",)
QKV_MULTISCALES: tuple[tuple[int, ...], ...] = ((),) * 5 + ((5,),)


def build_tiny_sana(target: Path) -> None:
    """A tiny `SanaPipeline`: generated at a 512-pixel bin, returned at the requested size."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel

    tokenizer = tokenizers.gemma_tokenizer()
    with parts.seeded():
        transformer = SanaTransformer2DModel(
            patch_size=1,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_layers=1,
            num_attention_heads=2,
            attention_head_dim=4,
            num_cross_attention_heads=2,
            cross_attention_head_dim=4,
            cross_attention_dim=8,
            caption_channels=TEXT_WIDTH,
            sample_size=16,
        )
        vae = AutoencoderDC(
            in_channels=3,
            latent_channels=LATENT_CHANNELS,
            attention_head_dim=2,
            encoder_block_types=BLOCK_TYPES,
            decoder_block_types=BLOCK_TYPES,
            encoder_block_out_channels=(8,) * len(BLOCK_TYPES),
            decoder_block_out_channels=(8,) * len(BLOCK_TYPES),
            encoder_qkv_multiscales=QKV_MULTISCALES,
            decoder_qkv_multiscales=QKV_MULTISCALES,
            encoder_layers_per_block=(1,) * len(BLOCK_TYPES),
            decoder_layers_per_block=(1,) * len(BLOCK_TYPES),
            downsample_block_type="conv",
            upsample_block_type="interpolate",
            decoder_norm_types="rms_norm",
            decoder_act_fns="silu",
            scaling_factor=0.41407,
        )
        text_encoder = parts.gemma2_encoder(
            tokenizer, TEXT_WIDTH, 1, heads=2, head_dim=16, intermediate_size=64
        )
    pipeline: Any = SanaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )
    pipeline.save_pretrained(str(target))
