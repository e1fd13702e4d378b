"""OmniRT's adaptations of diffusers' Modular Diffusers blocks, so they compute what the pipelines do.

The `modular` mode must make the image `legacy_call` (the diffusers pipeline) makes of the same
request and seed. Where a family's blocks differ from its pipeline, one function here makes this
pipeline's blocks do what the pipeline does: it replaces one sub-block of the workflow instance
`pipelines.py` built for one (model, task) with an OmniRT subclass. Nothing diffusers owns changes
in place (not a class, nor a step: diffusers' blocks share their step instances across the
process), so any other blocks (another pipeline's, a user's) stay as diffusers ships them. Each
fix is a no-op when its sub-block is not there (another workflow of the family); the parity tests
in tests/unit/worker/test_worker_modular_images.py and test_worker_modular_video.py say whether a
diffusers upgrade still needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep
from diffusers.modular_pipelines.hunyuan_video1_5.before_denoise import HunyuanVideo15PrepareLatentsStep
from diffusers.modular_pipelines.modular_pipeline_utils import OutputParam
from diffusers.modular_pipelines.qwenimage.encoders import QwenImageVaeEncoderStep, encode_vae_image
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE as FLUX2_SYSTEM_MESSAGE


class QwenImageSampledVaeEncoderStep(QwenImageVaeEncoderStep):
    """OmniRT: Qwen-Image's VAE encoder step sampling the latents with the request's generator, as
    the image2image and inpaint pipelines do (see `sample_qwen_image_latents`)."""

    @torch.no_grad()
    def __call__(self, components: Any, state: Any) -> tuple[Any, Any]:  # type: ignore[override]
        block_state: Any = self.get_block_state(state)
        image = getattr(block_state, self._image_input_name)
        images = image if isinstance(image, list) else [image]
        latents = [
            encode_vae_image(
                image=one,
                vae=components.vae,
                generator=block_state.generator,
                device=components._execution_device,
                dtype=components.vae.dtype,
                latent_channels=components.num_channels_latents,
                sample_mode="sample",
            )
            for one in images
        ]
        setattr(
            block_state, self._image_latents_output_name, latents if isinstance(image, list) else latents[0]
        )
        self.set_block_state(state, block_state)
        return components, state


def sample_qwen_image_latents(blocks: Any) -> bool:
    """Qwen-Image image2image and inpainting: encode the image by sampling the latent distribution.

    diffusers 0.42.1: `QwenImageVaeEncoderStep` takes the distribution's mean (`encode_vae_image`'s
    default `sample_mode="argmax"`) where `QwenImageImg2ImgPipeline` and `QwenImageInpaintPipeline`
    sample it with the request's generator, which also moves the noise drawn after it (up to
    113/255 from `legacy_call` on tiny-qwen-image). The step becomes one that samples.
    """
    name = "vae_encoder.encode"
    step = blocks.sub_blocks.get(name)
    if type(step) is not QwenImageVaeEncoderStep:
        return False
    blocks.sub_blocks[name] = QwenImageSampledVaeEncoderStep(input=step._input, output=step._output)
    return True


class Flux2PipelineMessageTextEncoderStep(Flux2TextEncoderStep):
    """OmniRT: FLUX.2's text encoder step with the pipeline's system message (see
    `flux2_system_message`)."""

    DEFAULT_SYSTEM_MESSAGE = FLUX2_SYSTEM_MESSAGE


def flux2_system_message(blocks: Any) -> bool:
    """FLUX.2: the text encoder reads the pipeline's system message, line break included.

    diffusers 0.42.1: `Flux2TextEncoderStep.DEFAULT_SYSTEM_MESSAGE` has a space where
    `diffusers.pipelines.flux2.system_messages.SYSTEM_MESSAGE` (`Flux2Pipeline`'s, BFL's own) has a
    line break, so the prompt embeddings differ (1/255 on ~1% of tiny-flux2's pixels, other
    embeddings on a real checkpoint). The step is replaced, not given the message: diffusers'
    blocks share one step instance per process (module-level `AUTO_BLOCKS`), so setting it
    there would change every FLUX.2 blocks instance.
    """
    step = blocks.sub_blocks.get("text_encoder")
    if type(step) is not Flux2TextEncoderStep:
        return False
    blocks.sub_blocks["text_encoder"] = Flux2PipelineMessageTextEncoderStep()
    return True


class HunyuanVideo15NoiseLatentsStep(HunyuanVideo15PrepareLatentsStep):
    """OmniRT: HunyuanVideo 1.5's text2video latents step without its zero `image_embeds`, for
    image2video (see `keep_hunyuan_video15_image_embeds`)."""

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [out for out in super().intermediate_outputs if out.name != "image_embeds"]


def keep_hunyuan_video15_image_embeds(blocks: Any) -> bool:
    """HunyuanVideo 1.5 image2video: the image encoder's SigLIP embeddings reach the denoiser.

    diffusers 0.42.1: the image2video denoise step runs the text2video `prepare_latents` step
    first, which writes zero `image_embeds` (729 tokens) over the image encoder step's, so the
    video ignores the image embedding `HunyuanVideo15ImageToVideoPipeline` conditions on (frames
    up to 35/255 from `legacy_call`'s on tiny-hunyuan-video15-i2v). That step becomes one that
    prepares the noise latents (and the conditioning the image2video step then replaces), not
    the image embeddings.
    """
    name = "denoise.prepare_latents"
    step = blocks.sub_blocks.get(name)
    image2video = "denoise.prepare_i2v_latents" in blocks.sub_blocks
    if type(step) is not HunyuanVideo15PrepareLatentsStep or not image2video:
        return False
    blocks.sub_blocks[name] = HunyuanVideo15NoiseLatentsStep()
    return True


BlockFix = Callable[[Any], bool]
"""Adapts one workflow's blocks instance in place; True when it changed something."""

FIXES: dict[str, tuple[BlockFix, ...]] = {
    "QwenImageAutoBlocks": (sample_qwen_image_latents,),
    "Flux2AutoBlocks": (flux2_system_message,),
    "HunyuanVideo15AutoBlocks": (keep_hunyuan_video15_image_embeds,),
}
"""The diffusers blocks class -> the fixes its workflows may need."""


def apply_block_fixes(blocks_class: str, blocks: Any) -> list[str]:
    """Apply `blocks_class`'s fixes to `blocks` (one workflow's instance); the names of those applied."""
    return [fix.__name__ for fix in FIXES.get(blocks_class, ()) if fix(blocks)]
