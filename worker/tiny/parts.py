"""Tiny parts shared by the family builders: the seeded RNG they are made from, CLIP, T5, UMT5,
Llama and Gemma 2 text encoders, a CLIP image encoder, a 2-block UNet, an image VAE,
HunyuanVideo's video VAE and FLUX.1's scheduler.

Each returns a freshly initialised module from the caller's RNG: builders make their parts
inside `seeded()` in a fixed order, so every machine builds identical weights.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omnirt.worker.tiny import tokenizers

# The width of every tiny text encoder (the transformers' `joint_attention_dim` and friends).
TEXT_WIDTH = 32

# `image_vae` arguments for the latent normalisation of SD3's and FLUX.1's VAEs (neither has
# quant convs); HiDream and Lumina-Image 2.0 reuse them.
SD3_LATENTS: Mapping[str, Any] = MappingProxyType(
    {"use_quant_conv": False, "use_post_quant_conv": False, "shift_factor": 0.0609, "scaling_factor": 1.5035}
)
FLUX_LATENTS: Mapping[str, Any] = MappingProxyType(
    {"use_quant_conv": False, "use_post_quant_conv": False, "shift_factor": 0.1159, "scaling_factor": 0.3611}
)


@contextmanager
def seeded() -> Iterator[None]:
    """Seed a forked CPU RNG with 0 for the block: identical weights everywhere, the caller's RNG
    untouched."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def clip_tokenizer(max_length: int | None = 77) -> Any:
    """The offline CLIP tokenizer (the one tiny-sd ships), loaded from its files; `max_length`
    None keeps transformers' unbounded `model_max_length`."""
    from transformers import CLIPTokenizer

    limit: dict[str, Any] = {} if max_length is None else {"model_max_length": max_length}
    with tempfile.TemporaryDirectory() as vocab_dir:
        tokenizers.write_clip_tokenizer_files(Path(vocab_dir))
        return CLIPTokenizer.from_pretrained(vocab_dir, **limit)


def clip_text_config(
    tokenizer: Any,
    width: int = TEXT_WIDTH,
    layers: int = 2,
    *,
    intermediate_size: int | None = None,
    positions: int = 77,
    projection_dim: int | None = None,
    **config: Any,
) -> Any:
    """A `CLIPTextConfig` for `tokenizer`: `width` wide, the MLP twice and the projection as wide
    unless given; `config` sets the rest (`hidden_act`)."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width if intermediate_size is None else intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=positions,
        projection_dim=width if projection_dim is None else projection_dim,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config,
    )


def clip_image_encoder(image_size: int, patch_size: int, layers: int, width: int = TEXT_WIDTH) -> Any:
    """A `CLIPVisionModelWithProjection` `width` wide (projection as wide) for square images of
    `image_size` in `patch_size` patches."""
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    return CLIPVisionModelWithProjection(
        CLIPVisionConfig(
            hidden_size=width,
            projection_dim=width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            image_size=image_size,
            intermediate_size=37,
            patch_size=patch_size,
        )
    )


def _t5_config(tokenizer: Any, width: int, layers: int, d_kv: int, d_ff: int | None) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "d_model": width,
        "d_kv": d_kv,
        "d_ff": 2 * width if d_ff is None else d_ff,
        "num_layers": layers,
        "num_heads": 4,
        "relative_attention_num_buckets": 8,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def t5_encoder(
    tokenizer: Any, width: int = TEXT_WIDTH, layers: int = 2, *, d_kv: int = 8, d_ff: int | None = None
) -> Any:
    """A `T5EncoderModel` for `tokenizer` (the offline T5 one, or ByT5's), `width` wide, its
    feed-forward twice as wide unless `d_ff` says otherwise."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(**_t5_config(tokenizer, width, layers, d_kv, d_ff)))


def umt5_encoder(tokenizer: Any, width: int = TEXT_WIDTH, layers: int = 2) -> Any:
    """A `UMT5EncoderModel` (Wan's text encoder) for `tokenizer` (the offline T5 one), `width`
    wide, its feed-forward twice as wide."""
    from transformers import UMT5Config, UMT5EncoderModel

    return UMT5EncoderModel(
        UMT5Config(
            **_t5_config(tokenizer, width, layers, d_kv=8, d_ff=None),
            decoder_start_token_id=tokenizer.pad_token_id,
        )
    )


def llama_config(tokenizer: Any, width: int, layers: int, intermediate_size: int, **config: Any) -> Any:
    """A `LlamaConfig` of 4 heads (no grouping) for `tokenizer` (the offline Llama one); `config`
    sets the rest."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=intermediate_size,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=layers,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config,
    )


def gemma2_encoder(
    tokenizer: Any, width: int, layers: int, *, heads: int, head_dim: int, intermediate_size: int
) -> Any:
    """A `Gemma2Model` for `tokenizer` (the offline Gemma one), `heads` heads (no grouping)."""
    from transformers import Gemma2Config, Gemma2Model

    return Gemma2Model(
        Gemma2Config(
            head_dim=head_dim,
            hidden_size=width,
            intermediate_size=intermediate_size,
            num_attention_heads=heads,
            num_hidden_layers=layers,
            num_key_value_heads=heads,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    )


def unet(**config: Any) -> Any:
    """A 2-block `UNet2DConditionModel` of widths 32 and 64 on 8x8 latents of 4 channels,
    cross-attention in its second block; `config` sets the rest (the cross-attention width)."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        block_out_channels=(32, 64),
        layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        norm_num_groups=32,
        **config,
    )


def image_vae(latent_channels: int = 4, vae_class: Any = None, **config: Any) -> Any:
    """An `AutoencoderKL` (or `vae_class`, one that takes its arguments: FLUX.2's) with the real
    8x spatial factor (four blocks), tiny channels; `config` overrides."""
    from diffusers import AutoencoderKL

    return (vae_class or AutoencoderKL)(
        **{
            "in_channels": 3,
            "out_channels": 3,
            "down_block_types": ("DownEncoderBlock2D",) * 4,
            "up_block_types": ("UpDecoderBlock2D",) * 4,
            "block_out_channels": (8, 16, 16, 16),
            "layers_per_block": 1,
            "latent_channels": latent_channels,
            "norm_num_groups": 8,
            "sample_size": 64,
            **config,
        }
    )


def hunyuan_video_vae(latent_channels: int = 4) -> Any:
    """An `AutoencoderKLHunyuanVideo` of width 8 with HunyuanVideo's compression (8x spatial,
    4x temporal) and scaling."""
    from diffusers import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo(
        latent_channels=latent_channels,
        down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        norm_num_groups=4,
        scaling_factor=0.476986,
        spatial_compression_ratio=8,
        temporal_compression_ratio=4,
    )


def flux_scheduler() -> Any:
    """FLUX.1-dev's dynamically shifted `FlowMatchEulerDiscreteScheduler` (FLUX.2-dev's too)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
