"""Tiny random-weight Wan 2.2 video models (`builtin:tiny-wan22`, `tiny-wan22-i2v`, `tiny-wan22-ti2v`).

Real diffusers pipelines with small seeded weights, built offline from the parts of `tiny-wan`
(`parts.umt5_encoder`, `wan.wan_vae`, `wan.transformer_config`: its 2-layer UMT5 of width 32,
offline T5 tokenizer, 4-channel `AutoencoderKLWan` with 8x spatial and 4x temporal compression)
and saved with `save_pretrained`; the scheduler is the hub's `UniPCMultistepScheduler` (flow
sigmas, shift 3 here, so that 2 steps already run both experts).

- `tiny-wan22`, `WanPipeline` as Wan2.2-T2V-A14B: two experts, `transformer` for the high-noise
  steps (timestep >= boundary_ratio 0.875 x 1000) and `transformer_2` for the low-noise ones.
- `tiny-wan22-i2v`, `WanImageToVideoPipeline` as Wan2.2-I2V-A14B: the same two experts
  (boundary 0.9) with 4 + 4 (mask) + 4 (image latents) input channels; no CLIP image encoder,
  the first frame is encoded by the VAE.
- `tiny-wan22-ti2v`, as Wan2.2-TI2V-5B: one transformer, `expand_timesteps` (a timestep per
  token, so the image's latent frame stays clean) and the 5B's VAE layout: residual, 2x2 input
  patches, 16x spatial compression, 48 latent channels. Saved as a `WanPipeline` (text-to-video);
  `WanImageToVideoPipeline` loads the same folder for image-to-video.

Sizes: multiples of 16 (8 x the (1, 2, 2) patch), for the TI2V model of 32 (16 x 2); frames 4k+1
(the pipelines round other counts themselves). 64x64, 9 frames and 2 steps take under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts, tokenizers, wan

# The timestep fractions at which Wan2.2's A14B models hand over to the low-noise expert.
T2V_BOUNDARY_RATIO = 0.875
I2V_BOUNDARY_RATIO = 0.9
# The TI2V-5B VAE: 48 latent channels, 2x2 pixel patches in (12 = 3 x 2 x 2 channels), 16x.
TI2V_LATENT_CHANNELS = 48


def _scheduler() -> Any:
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0)


def _two_experts(transformer_in_channels: int) -> dict[str, Any]:
    """Seeded tokenizer, text encoder, VAE, both experts (different weights) and the scheduler."""
    from diffusers import WanTransformer3DModel

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.umt5_encoder(tokenizer)
        vae = wan.wan_vae()
        config = wan.transformer_config(transformer_in_channels)
        transformer = WanTransformer3DModel(**config)
        transformer_2 = WanTransformer3DModel(**config)
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "transformer": transformer,
        "transformer_2": transformer_2,
        "scheduler": _scheduler(),
    }


def build_tiny_wan22(target: Path) -> None:
    """A tiny Wan 2.2 A14B-style text-to-video `WanPipeline` with two experts."""
    from diffusers import WanPipeline

    components = _two_experts(wan.LATENT_CHANNELS)
    pipeline: Any = WanPipeline(**components, boundary_ratio=T2V_BOUNDARY_RATIO)
    pipeline.save_pretrained(str(target))


def build_tiny_wan22_i2v(target: Path) -> None:
    """A tiny Wan 2.2 A14B-style image-to-video `WanImageToVideoPipeline` with two experts and
    no image encoder."""
    from diffusers import WanImageToVideoPipeline

    components = _two_experts(2 * wan.LATENT_CHANNELS + wan.MASK_CHANNELS)
    pipeline: Any = WanImageToVideoPipeline(
        **components, image_encoder=None, image_processor=None, boundary_ratio=I2V_BOUNDARY_RATIO
    )
    pipeline.save_pretrained(str(target))


def build_tiny_wan22_ti2v(target: Path) -> None:
    """A tiny Wan 2.2 TI2V-5B-style `WanPipeline` (`expand_timesteps`, 16x VAE of 48 channels)."""
    from diffusers import WanPipeline, WanTransformer3DModel

    tokenizer = tokenizers.t5_tokenizer()
    with parts.seeded():
        text_encoder = parts.umt5_encoder(tokenizer)
        vae = wan.wan_vae(
            z_dim=TI2V_LATENT_CHANNELS,
            is_residual=True,
            in_channels=12,
            out_channels=12,
            patch_size=2,
            scale_factor_spatial=16,
        )
        config = wan.transformer_config(TI2V_LATENT_CHANNELS, TI2V_LATENT_CHANNELS)
        transformer = WanTransformer3DModel(**config)
    pipeline: Any = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=_scheduler(),
        expand_timesteps=True,
    )
    pipeline.save_pretrained(str(target))
