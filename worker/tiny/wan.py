"""Tiny random-weight Wan video models (`builtin:tiny-wan`, `builtin:tiny-wan-i2v`).

Like `tiny-sd`, these are real diffusers pipelines with small seeded weights, built offline
and saved with `save_pretrained`: a `WanTransformer3DModel` of 2 layers, an `AutoencoderKLWan`
with 4 latent channels (8x spatial, 4x temporal compression), a 2-layer `UMT5EncoderModel` of
width 32 and a T5 (Unigram) tokenizer made from a hand-written vocabulary list, with a
`FlowMatchEulerDiscreteScheduler`. 64x64, 9 frames, 3 steps take well under a second on one core.

The image-to-video model is Wan 2.2-style: the first frame is encoded by the VAE and
concatenated to the latents with a mask (no CLIP image encoder), so the transformer takes
4 (noise) + 4 (mask) + 4 (image latents) input channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers

# Latent channels of the tiny VAE; the Wan VAE compresses 4 frames into one latent frame.
LATENT_CHANNELS = 4


def _components(transformer_in_channels: int) -> dict[str, Any]:
    """Seeded tokenizer, text encoder, VAE, transformer and scheduler shared by both builders."""
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = tokenizers.t5_tokenizer()
    # Seeded on a forked RNG: identical weights everywhere, the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tokenizer),
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=8,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id,
            )
        )
        vae = AutoencoderKLWan(
            base_dim=8,
            z_dim=LATENT_CHANNELS,
            dim_mult=[1, 1, 1, 1],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            latents_mean=[0.0] * LATENT_CHANNELS,
            latents_std=[1.0] * LATENT_CHANNELS,
        )
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=transformer_in_channels,
            out_channels=LATENT_CHANNELS,
            text_dim=32,
            freq_dim=32,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
        )
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "transformer": transformer,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=3.0),
    }


def build_tiny_wan(target: Path) -> None:
    """A tiny Wan text-to-video `WanPipeline` (64x64 by default, sizes multiple of 16)."""
    from diffusers import WanPipeline

    pipeline: Any = WanPipeline(**_components(LATENT_CHANNELS))
    pipeline.save_pretrained(str(target))


def build_tiny_wan_i2v(target: Path) -> None:
    """A tiny Wan image-to-video `WanImageToVideoPipeline` (first frame from the input image)."""
    from diffusers import WanImageToVideoPipeline

    # noise latents + a 4-channel frame mask + the VAE latents of the conditioning video.
    pipeline: Any = WanImageToVideoPipeline(**_components(3 * LATENT_CHANNELS))
    pipeline.save_pretrained(str(target))
