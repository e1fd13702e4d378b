"""Tiny random-weight HiDream-I1 text-to-image model (`builtin:tiny-hidream`).

A real diffusers `HiDreamImagePipeline` with small seeded weights in the shapes of diffusers' own
HiDream tests, built offline and saved with `save_pretrained`: a `HiDreamImageTransformer2DModel`
with one double- and one single-stream block of 4 routed experts (2 active), 2 heads and patch 2,
an `AutoencoderKL` with HiDream's (Flux's) 16 latent channels, shift and scale (8x), two 2-layer
`CLIPTextModelWithProjection` of width 32 (their pooled outputs, concatenated, condition the
blocks) with the offline CLIP tokenizer, a 2-layer `T5EncoderModel` of width 32 with the offline
T5 tokenizer, a 2-layer `LlamaForCausalLM` of width 32 with the offline Llama tokenizer (the
transformer reads the hidden states of each of its layers, one per block), and a
`FlowMatchEulerDiscreteScheduler` shifted as HiDream-I1's.

Sizes are multiples of 16 (VAE factor 8 x patch 2). The pipeline makes every image about 1024 x
1024 pixels in area, whatever was asked (its `default_sample_size` 128 x the VAE factor, squared;
it rescales the request to that area, keeping the aspect ratio): the tiny model is no exception,
so its images are 1024x1024, 1360x768 and the like (4096 image tokens, padded to that many when
not square), and the worker refuses a size the pipeline would rescale (`tasks.check_size`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 16
WIDTH = 32
# HiDream's CLIP encoders are long-context (248 positions); the pipeline pads their prompts to 128.
CLIP_POSITIONS = 248


def build_tiny_hidream(target: Path) -> None:
    """A tiny `HiDreamImagePipeline`: 1024x1024-area images, sizes multiple of 16."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        HiDreamImagePipeline,
        HiDreamImageTransformer2DModel,
    )
    from transformers import CLIPTextModelWithProjection, LlamaForCausalLM

    tokenizer = parts.clip_tokenizer(max_length=CLIP_POSITIONS)
    tokenizer_2 = parts.clip_tokenizer(max_length=CLIP_POSITIONS)
    tokenizer_3 = tokenizers.t5_tokenizer()
    tokenizer_4 = tokenizers.llama_tokenizer()
    clip_config = parts.clip_text_config(tokenizer, WIDTH, positions=CLIP_POSITIONS)
    with parts.seeded():
        text_encoder = CLIPTextModelWithProjection(clip_config)
        text_encoder_2 = CLIPTextModelWithProjection(clip_config)
        text_encoder_3 = parts.t5_encoder(tokenizer_3, WIDTH)
        text_encoder_4 = LlamaForCausalLM(
            parts.llama_config(tokenizer_4, WIDTH, 2, intermediate_size=64, max_position_embeddings=256)
        )
        transformer = HiDreamImageTransformer2DModel(
            patch_size=2,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=8,
            num_attention_heads=2,
            caption_channels=[WIDTH, WIDTH],  # T5's width, Llama's width
            text_emb_dim=2 * WIDTH,  # the two CLIP projections, concatenated
            num_routed_experts=4,
            num_activated_experts=2,
            axes_dims_rope=(4, 2, 2),  # sums to attention_head_dim
            # The real model's: the pipeline's fixed area in latents; non-square images pad to it.
            max_resolution=(128, 128),
            llama_layers=[0, 1],  # one Llama layer per block
        )
        # Narrower than `parts.image_vae`'s and without the mid-block attention: at the fixed
        # area's 128x128 latents they took half of each call.
        vae = parts.image_vae(
            LATENT_CHANNELS,
            block_out_channels=(4, 8, 8, 8),
            norm_num_groups=4,
            mid_block_add_attention=False,
            **parts.FLUX_LATENTS,
        )
    pipeline: Any = HiDreamImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
        text_encoder_4=text_encoder_4,
        tokenizer_4=tokenizer_4,
        transformer=transformer,
    )
    pipeline.save_pretrained(str(target))
