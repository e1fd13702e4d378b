"""Tiny random-weight Wan video models (`builtin:tiny-wan`, `builtin:tiny-wan-i2v`).

Like `tiny-sd`, these are real diffusers pipelines with small seeded weights, built offline
and saved with `save_pretrained`: a `WanTransformer3DModel` of 2 layers, an `AutoencoderKLWan`
with 4 latent channels (8x spatial, 4x temporal compression), a 2-layer `UMT5EncoderModel` of
width 32 and a T5 (Unigram) tokenizer made from a hand-written vocabulary list, with a
`FlowMatchEulerDiscreteScheduler`. 64x64, 9 frames, 3 steps take well under a second on one core.

The image-to-video model is Wan 2.2-style: the first frame is encoded by the VAE and
concatenated to the latents with a mask (no CLIP image encoder), so the transformer takes
4 (noise) + 4 (mask) + 4 (image latents) input channels.

`wan_vae` and `transformer_config` are the parts the families built on Wan's (Wan 2.2 in
`wan22`, SkyReels-V2 in `skyreels_v2`) share with these two, with the UMT5 (`parts.umt5_encoder`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

# Latent channels of the tiny VAE; the Wan VAE compresses 4 frames into one latent frame.
LATENT_CHANNELS = 4
# Channels of the first-frame mask Wan's image-to-video pipelines concatenate to the latents:
# one per frame a latent frame holds (the VAE's temporal factor).
MASK_CHANNELS = 4
# The width of the tiny UMT5 text encoder (the transformers' `text_dim`).
TEXT_WIDTH = parts.TEXT_WIDTH


def wan_vae(**config: Any) -> Any:
    """An `AutoencoderKLWan` of base width 8 with the real compression (8x spatial, 4x temporal)
    and `LATENT_CHANNELS` latent channels unless `config` says otherwise; the caller's RNG."""
    from diffusers import AutoencoderKLWan

    z_dim = config.pop("z_dim", LATENT_CHANNELS)
    return AutoencoderKLWan(
        **{
            "base_dim": 8,
            "z_dim": z_dim,
            "dim_mult": [1, 1, 1, 1],
            "num_res_blocks": 1,
            "temperal_downsample": [False, True, True],
            "latents_mean": [0.0] * z_dim,
            "latents_std": [1.0] * z_dim,
            **config,
        }
    )


def transformer_config(in_channels: int, out_channels: int = LATENT_CHANNELS) -> dict[str, Any]:
    """The tiny Wan transformer's config: 2 layers of 2 heads x 12, (1, 2, 2) patches.
    `SkyReelsV2Transformer3DModel` takes the same arguments."""
    return {
        "patch_size": (1, 2, 2),
        "num_attention_heads": 2,
        "attention_head_dim": 12,
        "in_channels": in_channels,
        "out_channels": out_channels,
        "text_dim": TEXT_WIDTH,
        "freq_dim": 32,
        "ffn_dim": 32,
        "num_layers": 2,
        "cross_attn_norm": True,
        "qk_norm": "rms_norm_across_heads",
        "rope_max_seq_len": 32,
    }


def _components(transformer_in_channels: int) -> dict[str, Any]:
    """Seeded tokenizer, text encoder, VAE, transformer and scheduler shared by both builders."""
    from diffusers import FlowMatchEulerDiscreteScheduler, WanTransformer3DModel

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.umt5_encoder(tokenizer, TEXT_WIDTH)
        vae = wan_vae()
        transformer = WanTransformer3DModel(**transformer_config(transformer_in_channels))
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
    pipeline: Any = WanImageToVideoPipeline(**_components(2 * LATENT_CHANNELS + MASK_CHANNELS))
    pipeline.save_pretrained(str(target))
