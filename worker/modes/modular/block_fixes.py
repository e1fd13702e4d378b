"""OmniRT's adaptations of diffusers' Modular Diffusers blocks, so they compute what the pipelines do.

The `modular` mode must make the image `legacy_call` (the diffusers pipeline) makes of the same
request and seed. Where a family's blocks differ from its pipeline, one function here makes this
pipeline's blocks do what the pipeline does: it replaces one sub-block (SDXL inpaint: two) of the
workflow instance `pipelines.py` built for one (model, task) with an OmniRT subclass. Nothing
diffusers owns changes in place (not a class, nor a step: diffusers' blocks share their step
instances across the process), so any other blocks (another pipeline's, a user's) stay as
diffusers ships them. Each fix is a no-op when its sub-block is not there (another workflow of
the family); the parity tests in tests/unit/worker/test_worker_modular_images.py,
test_worker_modular_video.py and test_worker_modular_diffusers.py say whether a diffusers upgrade
still needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from diffusers.modular_pipelines.flux2.encoders import Flux2TextEncoderStep
from diffusers.modular_pipelines.hunyuan_video1_5.before_denoise import HunyuanVideo15PrepareLatentsStep
from diffusers.modular_pipelines.modular_pipeline_utils import InputParam, OutputParam
from diffusers.modular_pipelines.qwenimage.encoders import QwenImageVaeEncoderStep, encode_vae_image
from diffusers.modular_pipelines.stable_diffusion_xl.before_denoise import (
    StableDiffusionXLInpaintPrepareLatentsStep,
)
from diffusers.modular_pipelines.stable_diffusion_xl.encoders import StableDiffusionXLInpaintVaeEncoderStep
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE as FLUX2_SYSTEM_MESSAGE


class QwenImageSampledVaeEncoderStep(QwenImageVaeEncoderStep):
    """OmniRT: Qwen-Image's VAE encoder step sampling the latents with the request's generator, as
    the image2image and inpaint pipelines do (see `sample_qwen_image_latents`)."""

    @torch.no_grad()
    def __call__(self, components: Any, state: Any) -> tuple[Any, Any]:
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


class StableDiffusionXLInpaintImageEncoderStep(StableDiffusionXLInpaintVaeEncoderStep):
    """OmniRT: SDXL's inpaint VAE encoder step that samples the image's latents only and hands the
    masked image on to the latents step (see `sdxl_inpaint_generator_order`)."""

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return [*super().intermediate_outputs, OutputParam("masked_image", type_hint=torch.Tensor)]

    def prepare_mask_latents(self, components: Any, mask: Any, masked_image: Any, *args: Any) -> Any:
        return super().prepare_mask_latents(components, mask, None, *args)  # the mask only: no draw


class StableDiffusionXLInpaintNoiseFirstLatentsStep(StableDiffusionXLInpaintPrepareLatentsStep):
    """OmniRT: SDXL's inpaint latents step that samples the masked image's latents after the noise
    (see `sdxl_inpaint_generator_order`)."""

    @property
    def inputs(self) -> list[Any]:  # diffusers annotates this one list[tuple[str, Any]]
        return [*super().inputs, InputParam("masked_image", type_hint=torch.Tensor)]

    @torch.no_grad()
    def __call__(self, components: Any, state: Any) -> tuple[Any, Any]:
        components, state = super().__call__(components, state)  # the noise
        block_state: Any = self.get_block_state(state)
        latents = block_state.image_latents
        _mask, masked_image_latents = self.prepare_mask_latents(
            components,
            block_state.mask,
            block_state.masked_image,
            block_state.batch_size * block_state.num_images_per_prompt,
            latents.shape[-2] * components.vae_scale_factor,
            latents.shape[-1] * components.vae_scale_factor,
            block_state.dtype if block_state.dtype is not None else components.vae.dtype,
            components._execution_device,
            block_state.generator,
        )
        # As the pipeline: sampled for every UNet, taken only by a 9-channel (inpainting) one.
        unet = getattr(components, "unet", None)
        if unet is None or unet.config.in_channels != 4:
            state.set("masked_image_latents", masked_image_latents)
        return components, state


def sdxl_inpaint_generator_order(blocks: Any) -> bool:
    """SDXL inpainting: the request's generator samples the image, the noise, then the masked image.

    diffusers 0.42.1: `StableDiffusionXLInpaintVaeEncoderStep` samples the image's and the masked
    image's latents (two draws) before `StableDiffusionXLInpaintPrepareLatentsStep` draws the
    noise, where `StableDiffusionXLInpaintPipeline` samples the image (in `prepare_latents`), draws
    the noise, then samples the masked image (`prepare_mask_latents`): the same seed gave another
    noise (up to 243/255 on half the pixels from `legacy_call`'s on tiny-sdxl). Two steps are
    replaced: the encoder step hands the masked image on unencoded, the latents step samples it
    after the noise, for a 4-channel UNet too (which never reads it, but an ancestral scheduler's
    step noise comes after that draw). Left as the blocks do: a 9-channel UNet at strength 1,
    where the pipeline does not sample the image at all.
    """
    encoder, latents = "vae_encoder", "denoise.before_denoise.prepare_latents"
    steps = blocks.sub_blocks
    if (
        type(steps.get(encoder)) is not StableDiffusionXLInpaintVaeEncoderStep
        or type(steps.get(latents)) is not StableDiffusionXLInpaintPrepareLatentsStep
    ):
        return False
    steps[encoder] = StableDiffusionXLInpaintImageEncoderStep()
    steps[latents] = StableDiffusionXLInpaintNoiseFirstLatentsStep()
    return True


BlockFix = Callable[[Any], bool]
"""Adapts one workflow's blocks instance in place; True when it changed something."""

FIXES: dict[str, tuple[BlockFix, ...]] = {
    "StableDiffusionXLAutoBlocks": (sdxl_inpaint_generator_order,),
    "QwenImageAutoBlocks": (sample_qwen_image_latents,),
    "Flux2AutoBlocks": (flux2_system_message,),
    "HunyuanVideo15AutoBlocks": (keep_hunyuan_video15_image_embeds,),
}
"""The diffusers blocks class -> the fixes its workflows may need."""


def apply_block_fixes(blocks_class: str, blocks: Any) -> list[str]:
    """Apply `blocks_class`'s fixes to `blocks` (one workflow's instance); the names of those applied."""
    return [fix.__name__ for fix in FIXES.get(blocks_class, ()) if fix(blocks)]
