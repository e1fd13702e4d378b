"""Tiny random-weight HunyuanVideo text-to-video model (`builtin:tiny-hunyuan-video`).

Like `tiny-cogvideox`, a real diffusers `HunyuanVideoPipeline` with small seeded weights, built
offline and saved with `save_pretrained`: a `HunyuanVideoTransformer3DModel` with one dual- and
one single-stream block (patch 2 as HunyuanVideo's, guidance embedding as its distilled model),
an `AutoencoderKLHunyuanVideo` with 4 latent channels (8x spatial, 4x temporal compression), a
3-layer `LlamaModel` with the offline Llama tokenizer (it encodes the pipeline's default prompt
template, whose crop needs no override), a `CLIPTextModel` with the offline CLIP tokenizer for
the pooled embedding, and a `FlowMatchEulerDiscreteScheduler` shifted as HunyuanVideo's.
Sizes are multiples of 16 (VAE factor 8 x patch 2); 9 frames make 3 latent frames.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 4
# The transformer's rotary axes (frames, height, width) must add up to the attention head width.
ROPE_AXES = (2, 4, 4)
LLAMA_WIDTH = 16
CLIP_WIDTH = 8


def build_tiny_hunyuan_video(target: Path) -> None:
    """A tiny HunyuanVideo text-to-video `HunyuanVideoPipeline` (sizes multiple of 16)."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextModel, LlamaModel

    tokenizer = tokenizers.llama_tokenizer()
    tokenizer_2 = parts.clip_tokenizer(max_length=None)
    with parts.seeded():
        # The pipeline reads the third-from-last hidden state: three layers leave one that encodes.
        text_encoder = LlamaModel(parts.llama_config(tokenizer, LLAMA_WIDTH, 3, intermediate_size=37))
        text_encoder_2 = CLIPTextModel(
            # The pooled embedding only: the projection keeps transformers' default width.
            parts.clip_text_config(tokenizer_2, CLIP_WIDTH, intermediate_size=37, projection_dim=512)
        )
        vae = parts.hunyuan_video_vae(LATENT_CHANNELS)
        transformer = HunyuanVideoTransformer3DModel(
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_attention_heads=2,
            attention_head_dim=sum(ROPE_AXES),
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=LLAMA_WIDTH,
            pooled_projection_dim=CLIP_WIDTH,
            rope_axes_dim=ROPE_AXES,
        )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=7.0)
    pipeline: Any = HunyuanVideoPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        tokenizer_2=tokenizer_2,
        text_encoder_2=text_encoder_2,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler,
    )
    pipeline.save_pretrained(str(target))
