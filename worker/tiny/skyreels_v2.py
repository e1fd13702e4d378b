"""Tiny random-weight SkyReels-V2 video models (`builtin:tiny-skyreels-v2`, `tiny-skyreels-v2-i2v`,
`tiny-skyreels-v2-df`).

SkyReels-V2 is Wan 2.1's architecture retrained (diffusers' `SkyReelsV2Transformer3DModel` takes
the Wan transformer's arguments); these are real diffusers pipelines with small seeded weights,
built offline from the parts of `tiny-wan` (`parts.umt5_encoder`, `wan.wan_vae`,
`wan.transformer_config`: a 2-layer UMT5 of width 32, the offline T5 tokenizer, a 4-channel
`AutoencoderKLWan`, 8x spatial and 4x temporal) and the hub's `UniPCMultistepScheduler` (flow
sigmas, shift 8 as the T2V models), saved with `save_pretrained`:

- `tiny-skyreels-v2`: `SkyReelsV2Pipeline`, text-to-video.
- `tiny-skyreels-v2-i2v`: `SkyReelsV2ImageToVideoPipeline`, Wan 2.1-style image-to-video: the
  first frame conditions both the latents (VAE-encoded, with a 4-channel mask: 4 + 4 + 4 input
  channels) and the cross-attention (a 2-layer `CLIPVisionModelWithProjection` of width 32 on
  32x32 images in 8x8 patches, with its own key/value projections as the real I2V models).
- `tiny-skyreels-v2-df`: `SkyReelsV2DiffusionForcingPipeline`, the long-video (diffusion
  forcing) text-to-video model; its transformer embeds the frame rate (`inject_sample_info`:
  16 fps and any other are two embeddings), so a request's fps changes the video.

Sizes: multiples of 16 (8 x the (1, 2, 2) patch); frames 4k+1 (the pipelines round other counts
themselves). 64x64, 9 frames and 2 steps take well under a second on one core.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers, wan

# The tiny CLIP image encoder of the image-to-video model: its input size and width.
IMAGE_SIZE = 32
IMAGE_WIDTH = 32


def _scheduler() -> Any:
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0)


def _components(**transformer: Any) -> dict[str, Any]:
    """Seeded tokenizer, text encoder, VAE, transformer (its config updated by `transformer`) and
    scheduler; `image_encoder` too when the transformer takes image embeddings (`image_dim`)."""
    from diffusers import SkyReelsV2Transformer3DModel

    tokenizer = tokenizers.t5_tokenizer()
    config = {**wan.transformer_config(wan.LATENT_CHANNELS), **transformer}
    components: dict[str, Any] = {"tokenizer": tokenizer, "scheduler": _scheduler()}
    with parts.seeded():
        components["text_encoder"] = parts.umt5_encoder(tokenizer)
        components["vae"] = wan.wan_vae()
        components["transformer"] = SkyReelsV2Transformer3DModel(**config)
        if config.get("image_dim"):
            components["image_encoder"] = parts.clip_image_encoder(IMAGE_SIZE, 8, 2, IMAGE_WIDTH)
    return components


def build_tiny_skyreels_v2(target: Path) -> None:
    """A tiny SkyReels-V2 text-to-video `SkyReelsV2Pipeline`."""
    from diffusers import SkyReelsV2Pipeline

    pipeline: Any = SkyReelsV2Pipeline(**_components())
    pipeline.save_pretrained(str(target))


def build_tiny_skyreels_v2_i2v(target: Path) -> None:
    """A tiny SkyReels-V2 image-to-video `SkyReelsV2ImageToVideoPipeline` (VAE and CLIP image)."""
    from diffusers import SkyReelsV2ImageToVideoPipeline
    from transformers import CLIPImageProcessor, CLIPProcessor

    inner = 2 * 12  # the transformer's heads x head width
    components = _components(
        in_channels=2 * wan.LATENT_CHANNELS + wan.MASK_CHANNELS,
        image_dim=IMAGE_WIDTH,
        added_kv_proj_dim=inner,
    )
    # A CLIPProcessor as the hub's I2V models ship (the pipeline only uses its image half).
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
        ),
        tokenizer=parts.clip_tokenizer(),
    )
    pipeline: Any = SkyReelsV2ImageToVideoPipeline(**components, image_processor=processor)
    pipeline.save_pretrained(str(target))


def build_tiny_skyreels_v2_df(target: Path) -> None:
    """A tiny SkyReels-V2 diffusion-forcing `SkyReelsV2DiffusionForcingPipeline` (fps embedded)."""
    from diffusers import SkyReelsV2DiffusionForcingPipeline

    pipeline: Any = SkyReelsV2DiffusionForcingPipeline(**_components(inject_sample_info=True))
    pipeline.save_pretrained(str(target))
