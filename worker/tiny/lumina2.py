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

from omnirt.worker.tiny import tokenizers

TEXT_WIDTH = 8
LATENT_CHANNELS = 4


def build_tiny_lumina2(target: Path) -> None:
    """A tiny `Lumina2Pipeline` (sizes multiple of 16)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        Lumina2Pipeline,
        Lumina2Transformer2DModel,
    )
    from transformers import Gemma2Config, Gemma2Model

    tokenizer = tokenizers.gemma_tokenizer()
    # Seeded on a forked RNG: identical weights everywhere, the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
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
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 8, 8, 8),
            layers_per_block=1,
            latent_channels=LATENT_CHANNELS,
            norm_num_groups=8,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        )
        text_encoder = Gemma2Model(
            Gemma2Config(
                head_dim=2,
                hidden_size=TEXT_WIDTH,
                intermediate_size=37,
                num_attention_heads=4,
                num_hidden_layers=2,
                num_key_value_heads=4,
                vocab_size=len(tokenizer),
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id,
            )
        )
    pipeline: Any = Lumina2Pipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )
    pipeline.save_pretrained(str(target))
