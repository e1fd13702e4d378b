"""The tiny random-weight Stable Diffusion XL (`builtin:tiny-sdxl`), text-to-image and image-to-image.

A real `StableDiffusionXLPipeline` with small seeded weights in the shapes diffusers' own SDXL
tests use, built offline and saved with `save_pretrained`: a 2-block UNet with SDXL's
`text_time` added conditioning (the pooled text embedding and the 6 size/crop micro-conditions),
a 4-block VAE with 4 latent channels (64x64 images from 8x8 latents, the real 8x factor), and
the two CLIP text encoders SDXL concatenates (a `CLIPTextModel` and a `CLIPTextModelWithProjection`,
each 2 layers of width 32) with the offline CLIP tokenizer of `tiny-sd`, and an Euler scheduler.
Image-to-image is diffusers' `StableDiffusionXLImg2ImgPipeline` on the same modules (`from_pipe`).

`text_time_unet` is the UNet `tiny-kolors` shares.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts

TEXT_WIDTH = parts.TEXT_WIDTH
# SDXL's added time ids: original size, crop top-left and target size, 2 numbers each.
TIME_IDS = 6
TIME_EMBED_DIM = 8


def text_time_unet(**config: Any) -> Any:
    """The tiny SDXL UNet (`parts.unet` with SDXL's attention layout and `text_time` added
    conditioning, cross-attention 64 wide); `config` adds to it."""
    return parts.unet(
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        transformer_layers_per_block=(1, 2),
        # The two encoders' hidden states are concatenated: 32 + 32.
        cross_attention_dim=2 * TEXT_WIDTH,
        addition_embed_type="text_time",
        addition_time_embed_dim=TIME_EMBED_DIM,
        # The time ids' embeddings and the pooled text embedding (32 wide).
        projection_class_embeddings_input_dim=TIME_IDS * TIME_EMBED_DIM + TEXT_WIDTH,
        **config,
    )


def build_tiny_sdxl(target: Path) -> None:
    """A tiny Stable Diffusion XL: 64x64 images (8x8 latents), two CLIP text encoders of width 32."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    tokenizer = parts.clip_tokenizer()
    text_config = parts.clip_text_config(tokenizer, TEXT_WIDTH, hidden_act="gelu")
    with parts.seeded():
        unet = text_time_unet()
        vae = parts.image_vae()
        text_encoder = CLIPTextModel(text_config)
        text_encoder_2 = CLIPTextModelWithProjection(text_config)
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
        timestep_spacing="leading",
    )
    pipeline: Any = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=scheduler,
        image_encoder=None,
        feature_extractor=None,
    )
    pipeline.save_pretrained(str(target))
