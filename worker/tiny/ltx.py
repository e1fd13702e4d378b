"""Tiny random-weight LTX-Video text-to-video model (`builtin:tiny-ltx-video`).

Like `tiny-wan`, a real diffusers `LTXPipeline` with small seeded weights, built offline and
saved with `save_pretrained`: a 1-layer `LTXVideoTransformer3DModel` (patch 1, as LTX-Video's),
an `AutoencoderKLLTXVideo` of width 8 with LTX-Video's own compression (patch 4 x three 2x
stages = 32x spatial, three 2x stages = 8x temporal), a 2-layer `T5EncoderModel` of width 32
with the offline T5 tokenizer, and a `FlowMatchEulerDiscreteScheduler`. Keeping the real
compression keeps the real grid: sizes are multiples of 32 and frame counts 8k+1 (9 frames
make 2 latent frames). image2video on it runs `LTXImageToVideoPipeline` on the same modules
(`from_pipe`, see `worker/pipelines/tasks.py`); the request's fps is LTX's `frame_rate`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 8


def build_tiny_ltx_video(target: Path) -> None:
    """A tiny LTX-Video text-to-video `LTXPipeline` (sizes multiple of 32, 8k+1 frames)."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.t5_encoder(tokenizer)
        vae = AutoencoderKLLTXVideo(
            latent_channels=LATENT_CHANNELS,
            block_out_channels=(8, 8, 8, 8),
            decoder_block_out_channels=(8, 8, 8, 8),
            spatio_temporal_scaling=(True, True, True, False),
            decoder_spatio_temporal_scaling=(True, True, True, False),
            layers_per_block=(1, 1, 1, 1, 1),
            decoder_layers_per_block=(1, 1, 1, 1, 1),
            patch_size=4,
            patch_size_t=1,
            encoder_causal=True,
            decoder_causal=False,
        )
        transformer = LTXVideoTransformer3DModel(
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            patch_size=1,
            patch_size_t=1,
            num_attention_heads=4,
            attention_head_dim=8,
            cross_attention_dim=32,
            num_layers=1,
            caption_channels=32,
        )
    pipeline: Any = LTXPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipeline.save_pretrained(str(target))
