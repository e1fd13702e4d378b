"""The tiny random-weight Stable Video Diffusion (`builtin:tiny-svd`), image-to-video.

A real `StableVideoDiffusionPipeline` with small seeded weights in the shapes diffusers' own
SVD tests use, built offline and saved with `save_pretrained`: a 2-block
`UNetSpatioTemporalConditionModel` of width 32-64, an `AutoencoderKLTemporalDecoder` with
4 latent channels (2x spatial compression), a 5-layer `CLIPVisionModelWithProjection` of
width 32 (224x224 in 14x14 patches) with its `CLIPImageProcessor`, and a v-prediction
`EulerDiscreteScheduler`. 48x32, 3 frames, 2 steps take about half a second on one core.
The pipeline takes no prompt: the input image conditions both the UNet (through its CLIP
embedding) and the latents (through its VAE encoding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnirt.worker.tiny import parts


def _components() -> dict[str, Any]:
    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor

    with parts.seeded():
        unet = UNetSpatioTemporalConditionModel(
            block_out_channels=(32, 64),
            layers_per_block=2,
            sample_size=32,
            in_channels=8,  # noise latents + the image's VAE latents
            out_channels=4,
            down_block_types=("CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"),
            up_block_types=("UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"),
            cross_attention_dim=32,
            num_attention_heads=8,
            # fps, motion bucket and noise augmentation, each embedded in 32 dimensions.
            projection_class_embeddings_input_dim=96,
            addition_time_embed_dim=32,
        )
        vae = AutoencoderKLTemporalDecoder(
            block_out_channels=[32, 64],
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
            latent_channels=4,
        )
        # The pipeline resizes its input to 224x224 before the image encoder, and transformers 5
        # refuses any other size (diffusers' tests' 32x32 with 1x1 patches no longer runs):
        # 224 in 14x14 patches, as the real ViT-H/14, is 256 tokens.
        image_encoder = parts.clip_image_encoder(image_size=224, patch_size=14, layers=5)
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        interpolation_type="linear",
        num_train_timesteps=1000,
        prediction_type="v_prediction",
        sigma_max=700.0,
        sigma_min=0.002,
        steps_offset=1,
        timestep_spacing="leading",
        timestep_type="continuous",
        use_karras_sigmas=True,
    )
    return {
        "unet": unet,
        "vae": vae,
        "image_encoder": image_encoder,
        "feature_extractor": CLIPImageProcessor(crop_size=32, size=32),
        "scheduler": scheduler,
    }


def build_tiny_svd(target: Path) -> None:
    """A tiny `StableVideoDiffusionPipeline` (32x32 by default, sizes multiple of 8)."""
    from diffusers import StableVideoDiffusionPipeline

    pipeline: Any = StableVideoDiffusionPipeline(**_components())
    pipeline.save_pretrained(str(target))
