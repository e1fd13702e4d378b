"""Which diffusers pipelines the `modular` mode runs, and on which Modular Diffusers blocks.

Pure data, no torch or diffusers import: the controller may read it to refuse a model at
validation, the worker reads it to refuse one before loading it. A pipeline class maps to a
`ModularFamily`: the diffusers blocks class (`diffusers.modular_pipelines`) and, per task, the
workflow of those blocks that runs it (`blocks.get_workflow(name)`; "" runs the blocks as they
are). Stable Diffusion 1.x/2.x has no blocks in diffusers 0.42: its family runs OmniRT's own
composed stages (`blocks == ""`, see `stages.py`).

Only families verified on a tiny model against `legacy_call` are listed (SDXL and Flux with
tests; SD3, Wan 2.1 text-to-video and LTX-Video text-to-video checked by hand; Wan 2.1
image-to-video, Wan 2.2 A14B text- and image-to-video and HunyuanVideo 1.5 text- and
image-to-video in tests/unit/worker/test_worker_modular_video.py; FLUX.2 text- and
image-conditioned and Qwen-Image text-to-image, image-to-image and inpaint in
tests/unit/worker/test_worker_modular_images.py). Where the blocks compute other than the
pipeline, `block_fixes.py` adapts the pipeline's own blocks instance (FLUX.2, Qwen-Image
image-to-image and inpaint, HunyuanVideo 1.5 image-to-video). diffusers 0.42.1 ships blocks for
more (Flux Kontext, Flux.2 Klein, QwenImage Layered, Z-Image, Wan VACE, ...): they stay off until
someone checks them the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from omnirt import types as t

COMPOSED = ""
"""`ModularFamily.blocks` of a family run by OmniRT's composed stages (SD 1.x/2.x)."""


@dataclass(frozen=True)
class ModularFamily:
    """How the modular mode runs one family of diffusers pipelines."""

    # The family's name in diffusers' modular registry ("stable-diffusion-xl"), for messages.
    name: str
    # The diffusers blocks class (`diffusers.<blocks>`); COMPOSED for OmniRT's own stages.
    blocks: str
    # Task -> workflow of `blocks` that runs it ("" = the blocks as they are).
    workflows: Mapping[t.Task, str] = field(default_factory=dict)
    # The blocks' final output (decoded images or videos) in the pipeline state.
    output: str = "images"
    # What the blocks get as `negative_prompt` when a request has none: None lets SDXL's
    # `force_zeros_for_empty_prompt` apply (as `legacy_call`'s call does); SD3's pipeline
    # encodes "" where its blocks would skip the negative half.
    empty_negative_prompt: str | None = None
    # Pipeline config keys that, when set, make the checkpoint one the mode cannot run (Wan 2.2
    # TI2V-5B's `expand_timesteps`, a timestep per latent token: no diffusers blocks do that).
    refused_configs: tuple[str, ...] = ()
    # Pipeline config key -> the family of a checkpoint with that key set: Wan 2.2's two-expert
    # checkpoints (`boundary_ratio`) load as Wan 2.1's classes and run on the Wan 2.2 blocks.
    by_config: tuple[tuple[str, ModularFamily], ...] = ()
    # False: the guider's config is the guidance and a request's guidance_scale is refused
    # (HunyuanVideo 1.5's pipelines take none, so `legacy_call` refuses it too).
    takes_guidance_scale: bool = True

    @property
    def composed(self) -> bool:
        """True when OmniRT's composed stages run it (no diffusers blocks)."""
        return self.blocks == COMPOSED

    @property
    def tasks(self) -> frozenset[t.Task]:
        """The tasks the family runs in the modular mode."""
        return frozenset(self.workflows)

    def refused(self, config: Mapping[str, object]) -> list[str]:
        """The `refused_configs` keys a checkpoint's pipeline `config` sets."""
        return [key for key in self.refused_configs if config.get(key)]


_SD = ModularFamily(
    "stable-diffusion",
    COMPOSED,
    {t.Task.TEXT2IMAGE: "", t.Task.IMAGE2IMAGE: "", t.Task.INPAINT: ""},
)
_SDXL = ModularFamily(
    "stable-diffusion-xl",
    "StableDiffusionXLAutoBlocks",
    {t.Task.TEXT2IMAGE: "text2image", t.Task.IMAGE2IMAGE: "image2image", t.Task.INPAINT: "inpainting"},
)
_FLUX = ModularFamily(
    "flux", "FluxAutoBlocks", {t.Task.TEXT2IMAGE: "text2image", t.Task.IMAGE2IMAGE: "image2image"}
)
_SD3 = ModularFamily(
    "stable-diffusion-3",
    "StableDiffusion3AutoBlocks",
    {t.Task.TEXT2IMAGE: "text2image", t.Task.IMAGE2IMAGE: "image2image"},
    empty_negative_prompt="",
)
# FLUX.2: its guidance is an embedding (a block input, no guider); image2image is the
# `image_conditioned` workflow (the input image a reference the transformer attends to, no strength).
# The text encoder step reads the pipeline's system message (OmniRT's `flux2_system_message` fix:
# the blocks' has a space where the pipeline's, BFL's, has a line break; see block_fixes.py).
_FLUX2 = ModularFamily(
    "flux2", "Flux2AutoBlocks", {t.Task.TEXT2IMAGE: "text2image", t.Task.IMAGE2IMAGE: "image_conditioned"}
)
# Qwen-Image: the guider is its true CFG (the request's guidance_scale, against "" when the request
# has no negative prompt, as `legacy_call` gives it `true_cfg_scale`). One checkpoint runs all
# three tasks; image2image and inpainting with OmniRT's `sample_qwen_image_latents` fix (the blocks'
# VAE encoder step takes the latents' mean where the pipelines sample them, see block_fixes.py).
_QWEN_IMAGE = ModularFamily(
    "qwen-image",
    "QwenImageAutoBlocks",
    {t.Task.TEXT2IMAGE: "text2image", t.Task.IMAGE2IMAGE: "image2image", t.Task.INPAINT: "inpainting"},
    empty_negative_prompt="",
)
# Wan 2.2 A14B: two experts (`transformer` above `boundary_ratio`, `transformer_2` below it),
# each with a guider of its own (`guider_2` takes the request's `extra.guidance_scale_2`).
_WAN22 = ModularFamily(
    "wan2.2", "Wan22Blocks", {t.Task.TEXT2VIDEO: ""}, output="videos", refused_configs=("expand_timesteps",)
)
_WAN22_I2V = ModularFamily(
    "wan2.2-i2v",
    "Wan22Image2VideoBlocks",
    {t.Task.IMAGE2VIDEO: ""},
    output="videos",
    refused_configs=("expand_timesteps",),
)
# Wan 2.1, and Wan 2.2 A14B by its config. TI2V-5B (`expand_timesteps`) stays off: the Wan
# blocks of diffusers 0.42.1 give every latent token the same timestep.
_WAN = ModularFamily(
    "wan",
    "WanBlocks",
    {t.Task.TEXT2VIDEO: ""},
    output="videos",
    refused_configs=("expand_timesteps",),
    by_config=(("boundary_ratio", _WAN22),),
)
# Wan 2.1 image-to-video: its CLIP image encoder is a required component (a checkpoint without
# one, as tiny-wan-i2v, is refused naming the model).
_WAN_I2V = ModularFamily(
    "wan-i2v",
    "WanImage2VideoAutoBlocks",
    {t.Task.IMAGE2VIDEO: "image2video"},
    output="videos",
    refused_configs=("expand_timesteps",),
    by_config=(("boundary_ratio", _WAN22_I2V),),
)
_HUNYUAN_VIDEO15 = ModularFamily(
    "hunyuan-video-1.5",
    "HunyuanVideo15AutoBlocks",
    {t.Task.TEXT2VIDEO: "text2video"},
    output="videos",
    takes_guidance_scale=False,
)
# Image-to-video is a checkpoint of its own (a SigLIP image encoder, a transformer that takes its
# embeddings), with OmniRT's `keep_hunyuan_video15_image_embeds` fix: in diffusers 0.42.1 the
# blocks' image2video denoise step runs the text-to-video `prepare_latents` step, whose zero
# `image_embeds` would replace the image encoder's (see block_fixes.py).
_HUNYUAN_VIDEO15_I2V = ModularFamily(
    "hunyuan-video-1.5-i2v",
    "HunyuanVideo15AutoBlocks",
    {t.Task.IMAGE2VIDEO: "image2video"},
    output="videos",
    takes_guidance_scale=False,
)
_LTX = ModularFamily(
    "ltx",
    "LTXAutoBlocks",
    {t.Task.TEXT2VIDEO: "text2video", t.Task.IMAGE2VIDEO: "image2video"},
    output="videos",
)

_FAMILIES: Mapping[str, ModularFamily] = MappingProxyType(
    {
        "StableDiffusionPipeline": _SD,
        "StableDiffusionImg2ImgPipeline": _SD,
        "StableDiffusionInpaintPipeline": _SD,
        "StableDiffusionXLPipeline": _SDXL,
        "StableDiffusionXLImg2ImgPipeline": _SDXL,
        "StableDiffusionXLInpaintPipeline": _SDXL,
        "FluxPipeline": _FLUX,
        "FluxImg2ImgPipeline": _FLUX,
        "StableDiffusion3Pipeline": _SD3,
        "StableDiffusion3Img2ImgPipeline": _SD3,
        "Flux2Pipeline": _FLUX2,
        "QwenImagePipeline": _QWEN_IMAGE,
        "QwenImageImg2ImgPipeline": _QWEN_IMAGE,
        "QwenImageInpaintPipeline": _QWEN_IMAGE,
        "WanPipeline": _WAN,
        "WanImageToVideoPipeline": _WAN_I2V,
        "HunyuanVideo15Pipeline": _HUNYUAN_VIDEO15,
        "HunyuanVideo15ImageToVideoPipeline": _HUNYUAN_VIDEO15_I2V,
        "LTXPipeline": _LTX,
        "LTXImageToVideoPipeline": _LTX,
    }
)


def modular_families() -> dict[str, ModularFamily]:
    """Pipeline class name -> the `ModularFamily` that runs it, for every class the mode runs."""
    return dict(_FAMILIES)


def modular_family(pipeline_class: str, config: Mapping[str, object] | None = None) -> ModularFamily | None:
    """The family of diffusers pipeline class `pipeline_class` (of the checkpoint whose pipeline
    config is `config`, when given), or None when the mode cannot run it."""
    family = _FAMILIES.get(pipeline_class)
    if family is None or not config:
        return family
    return next((other for key, other in family.by_config if config.get(key)), family)


def supports_modular(pipeline_class: str, task: t.Task | None = None) -> bool:
    """Whether the modular mode runs `pipeline_class` (and `task` on it, when given)."""
    family = _FAMILIES.get(pipeline_class)
    return family is not None and (task is None or task in family.workflows)
