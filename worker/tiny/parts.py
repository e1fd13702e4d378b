"""Tiny parts shared by the family builders: CLIP and T5 text encoders, an image VAE.

Each returns a freshly initialised module from the caller's RNG: builders seed a forked RNG
once and make their parts in a fixed order, so every machine builds identical weights.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import tokenizers

# The width of every tiny text encoder (the transformers' `joint_attention_dim` and friends).
TEXT_WIDTH = 32


def clip_tokenizer(max_length: int = 77) -> Any:
    """The offline CLIP tokenizer (the one tiny-sd ships), loaded from its files."""
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory() as vocab_dir:
        tokenizers.write_clip_tokenizer_files(Path(vocab_dir))
        return CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=max_length)


def clip_text_config(tokenizer: Any, width: int = TEXT_WIDTH, layers: int = 2) -> Any:
    """A `CLIPTextConfig` for `tokenizer`: `width` wide, projection as wide."""
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=77,
        projection_dim=width,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def t5_encoder(tokenizer: Any, width: int = TEXT_WIDTH, layers: int = 2) -> Any:
    """A `T5EncoderModel` for `tokenizer` (the offline T5 one), `width` wide."""
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer),
            d_model=width,
            d_kv=8,
            d_ff=2 * width,
            num_layers=layers,
            num_heads=4,
            relative_attention_num_buckets=8,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )


def image_vae(latent_channels: int = 4, **config: Any) -> Any:
    """An `AutoencoderKL` with the real 8x spatial factor (four blocks), tiny channels."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
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
