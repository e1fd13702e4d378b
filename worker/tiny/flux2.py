"""Tiny random-weight FLUX.2 model (`builtin:tiny-flux2`): text-to-image, and image-conditioned.

A real diffusers `Flux2Pipeline` with small seeded weights in the shapes of diffusers' own FLUX.2
tests, built offline and saved with `save_pretrained`: a `Flux2Transformer2DModel` with one
double- and one single-stream block and guidance embedding (as FLUX.2-dev: the request's
guidance_scale reaches the model, there is no negative prompt), an `AutoencoderKLFlux2` with 4
latent channels (8x, 2x2 patches batch-normed into 16 channels), a `Mistral3ForConditionalGeneration`
of width 16 (a 1-layer Pixtral vision tower, a 30-layer Mistral: the pipeline stacks the hidden
states of layers 10, 20 and 30 into the transformer's 48-wide text input) with the offline Mistral
tokenizer and its chat template, and a `FlowMatchEulerDiscreteScheduler` dynamically shifted as
FLUX.2-dev's.

The real model's `tokenizer` is a `PixtralProcessor`, which needs torchvision; the pipeline only
applies its chat template to text, which the tokenizer alone does, so the tiny model ships the
tokenizer (caption upsampling, `caption_upsample_temperature`, needs the processor).

The pipeline packs 2x2 latent patches into one token: sizes are multiples of 16 (VAE factor
8 x 2). An input image is a reference the transformer attends to (FLUX.2's editing), not a
starting point: it has no strength.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers

LATENT_CHANNELS = 4
TEXT_WIDTH = 16
# The pipeline's default `text_encoder_out_layers` are (10, 20, 30): 30 layers make them exist.
TEXT_LAYERS = 30


def build_tiny_flux2(target: Path) -> None:
    """A tiny `Flux2Pipeline`: sizes multiple of 16, 64x64 in the tests."""
    from diffusers import AutoencoderKLFlux2, Flux2Pipeline, Flux2Transformer2DModel
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    tokenizer = tokenizers.mistral_tokenizer()
    special_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = Mistral3Config(
        text_config={
            "model_type": "mistral",
            "vocab_size": len(tokenizer),
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 32,
            "num_hidden_layers": TEXT_LAYERS,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 4,
            "max_position_embeddings": 1024,
            "rope_theta": 1000000000.0,
            "sliding_window": None,
            **special_ids,
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": TEXT_WIDTH,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "head_dim": 4,
            "image_size": 32,
            "patch_size": 8,
        },
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        **special_ids,
    )
    with parts.seeded():
        text_encoder = Mistral3ForConditionalGeneration(config)
        transformer = Flux2Transformer2DModel(
            patch_size=1,
            in_channels=4 * LATENT_CHANNELS,  # a 2x2 patch of latents per token
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=3 * TEXT_WIDTH,  # three of Mistral's hidden states, stacked
            timestep_guidance_channels=256,
            axes_dims_rope=(4, 4, 4, 4),  # sums to attention_head_dim
            guidance_embeds=True,
        )
        vae = parts.image_vae(
            LATENT_CHANNELS, AutoencoderKLFlux2, use_quant_conv=False, use_post_quant_conv=False
        )
    pipeline: Any = Flux2Pipeline(
        scheduler=parts.flux_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipeline.save_pretrained(str(target))
