"""Tiny random-weight Stable Diffusion 3 text-to-image model (`builtin:tiny-sd3`).

A real diffusers `StableDiffusion3Pipeline` with small seeded weights in the shapes of
diffusers' own SD3 tests, built offline and saved with `save_pretrained`: a 1-layer
`SD3Transformer2DModel` (patch 2), an `AutoencoderKL` with SD3's 16 latent channels and
shift/scaling (8x compression), two 2-layer `CLIPTextModelWithProjection` of width 32 with
the offline CLIP tokenizer of `tiny-sd`, a 2-layer `T5EncoderModel` of width 64 with the
offline T5 tokenizer, and SD3's `FlowMatchEulerDiscreteScheduler` (shift 3). Sizes are
multiples of 16 (VAE factor 8 x patch 2); 64x64 makes 8x8 latents, 16 image tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers

CLIP_WIDTH = 32
# SD3's real 16 latent channels: its inpaint pipeline accepts a transformer of 16 (or 33) only.
LATENT_CHANNELS = 16
# SD3 pads the two CLIP encoders' joined hidden states (2 x 32) to T5's width and
# concatenates them with T5's tokens: T5 must be at least as wide as both CLIPs together.
T5_WIDTH = 2 * CLIP_WIDTH


def _clip_encoder(tokenizer: Any) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return CLIPTextModelWithProjection(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=CLIP_WIDTH,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=77,
            projection_dim=CLIP_WIDTH,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )


def build_tiny_sd3(target: Path) -> None:
    """A tiny `StableDiffusion3Pipeline`: 64x64 images by default, sizes multiple of 16."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        SD3Transformer2DModel,
        StableDiffusion3Pipeline,
    )
    from transformers import CLIPTokenizer, T5Config, T5EncoderModel

    with tempfile.TemporaryDirectory() as vocab_dir:
        tokenizers.write_clip_tokenizer_files(Path(vocab_dir))
        tokenizer = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)
        tokenizer_2 = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)
    tokenizer_3 = tokenizers.t5_tokenizer()
    # Seeded on a forked RNG: identical weights everywhere, the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        text_encoder = _clip_encoder(tokenizer)
        text_encoder_2 = _clip_encoder(tokenizer_2)
        text_encoder_3 = T5EncoderModel(
            T5Config(
                vocab_size=len(tokenizer_3),
                d_model=T5_WIDTH,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=tokenizer_3.pad_token_id,
                eos_token_id=tokenizer_3.eos_token_id,
            )
        )
        transformer = SD3Transformer2DModel(
            sample_size=8,
            patch_size=2,
            in_channels=LATENT_CHANNELS,
            out_channels=LATENT_CHANNELS,
            num_layers=1,
            attention_head_dim=8,
            num_attention_heads=4,
            caption_projection_dim=32,
            joint_attention_dim=T5_WIDTH,
            pooled_projection_dim=2 * CLIP_WIDTH,  # both CLIPs' pooled projections, joined
            pos_embed_max_size=32,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=LATENT_CHANNELS,
            norm_num_groups=8,
            sample_size=64,
            use_quant_conv=False,
            use_post_quant_conv=False,
            shift_factor=0.0609,
            scaling_factor=1.5035,
        )
    pipeline: Any = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        text_encoder_3=text_encoder_3,
        tokenizer_3=tokenizer_3,
    )
    pipeline.save_pretrained(str(target))
