"""The tiny random-weight Kolors (`builtin:tiny-kolors`), text-to-image and image-to-image.

A real diffusers `KolorsPipeline` with small seeded weights, built offline and saved with
`save_pretrained`: `tiny-sdxl`'s 2-block `UNet2DConditionModel` with SDXL's `text_time` added
conditioning (the pooled text embedding and the 6 size/crop micro-conditions) and, as Kolors, a
`text_proj` from the text encoder's width to the cross-attention width; a 4-block `AutoencoderKL`
with 4 latent channels (the real 8x factor); a 2-layer `ChatGLMModel` of width 32 (diffusers'
copy of ChatGLM3, multi-query attention with 2 groups and QKV bias as Kolors' encoder) with a
`ChatGLMTokenizer` over the offline SentencePiece model; and Kolors' Euler scheduler (1100 training
steps). Image-to-image is diffusers' `KolorsImg2ImgPipeline` on the same modules (`from_pipe`).

Sizes are multiples of 8 (the UNet takes any latent size); the UNet's `sample_size` 8 makes the
default size 64x64. The ChatGLM tokenizer needs the `sentencepiece` package.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, sdxl, tokenizers

# ChatGLM's width: the SDXL UNet's pooled and cross-attention widths are made for it.
TEXT_WIDTH = sdxl.TEXT_WIDTH


def _tokenizer(folder: Path) -> Any:
    """A `ChatGLMTokenizer` over `tokenizers.sentencepiece_unigram_model`, written into `folder`.

    The tokenizer copies that file on `save_pretrained`: `folder` must outlive the save.
    """
    from diffusers.pipelines.kolors import ChatGLMTokenizer

    model_file = folder / "tokenizer.model"
    model_file.write_bytes(tokenizers.sentencepiece_unigram_model())
    return ChatGLMTokenizer(vocab_file=str(model_file))


def _text_encoder(vocab_size: int) -> Any:
    """A 2-layer ChatGLM3-shaped encoder of width 32 over `vocab_size` ids."""
    import torch
    from diffusers.pipelines.kolors import ChatGLMModel
    from diffusers.pipelines.kolors.text_encoder import ChatGLMConfig, RMSNorm

    config = ChatGLMConfig(
        num_layers=2,
        padded_vocab_size=vocab_size,
        hidden_size=TEXT_WIDTH,
        ffn_hidden_size=2 * TEXT_WIDTH,
        kv_channels=8,
        num_attention_heads=4,
        seq_length=256,
        multi_query_attention=True,
        multi_query_group_num=2,
        add_qkv_bias=True,
        original_rope=True,
    )
    # `empty_init` (the default) leaves every weight as uninitialised memory: not reproducible.
    encoder = ChatGLMModel(config, empty_init=False)
    for module in encoder.modules():
        if isinstance(module, RMSNorm):  # made with torch.empty even so
            torch.nn.init.ones_(module.weight)
    return encoder


def build_tiny_kolors(target: Path) -> None:
    """A tiny `KolorsPipeline`: 64x64 images by default (8x8 latents), sizes multiple of 8."""
    from diffusers import EulerDiscreteScheduler, KolorsPipeline

    with tempfile.TemporaryDirectory() as folder:
        tokenizer = _tokenizer(Path(folder))
        with parts.seeded():
            text_encoder = _text_encoder(tokenizer.vocab_size)  # the pieces and ChatGLM's 9 commands
            # Kolors projects ChatGLM's hidden states (4096 wide there) to the cross-attention
            # width; the pooled text embedding is ChatGLM's last token's state.
            unet = sdxl.text_time_unet(encoder_hid_dim=TEXT_WIDTH, encoder_hid_dim_type="text_proj")
            vae = parts.image_vae(4, scaling_factor=0.13025)  # SDXL's VAE scaling, as Kolors'
        # Kwai-Kolors/Kolors-diffusers' scheduler config.
        scheduler = EulerDiscreteScheduler(
            num_train_timesteps=1100,
            beta_start=0.00085,
            beta_end=0.014,
            beta_schedule="scaled_linear",
            steps_offset=1,
            timestep_spacing="leading",
        )
        pipeline: Any = KolorsPipeline(
            vae=vae,
            text_encoder=text_encoder,
            tokenizer=tokenizer,
            unet=unet,
            scheduler=scheduler,
            force_zeros_for_empty_prompt=False,
        )
        pipeline.save_pretrained(str(target))
