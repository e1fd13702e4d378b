"""Which diffusers pipelines the `modular` mode runs, and on which Modular Diffusers blocks.

Pure data, no torch or diffusers import: the controller may read it to refuse a model at
validation, the worker reads it to refuse one before loading it. A pipeline class maps to a
`ModularFamily`: the diffusers blocks class (`diffusers.modular_pipelines`) and, per task, the
workflow of those blocks that runs it (`blocks.get_workflow(name)`; "" runs the blocks as they
are). Stable Diffusion 1.x/2.x has no blocks in diffusers 0.42: its family runs OmniRT's own
composed stages (`blocks == ""`, see `stages.py`).

Only families verified on a tiny model against `legacy_call` are listed (SDXL and Flux with
tests; SD3, Wan 2.1 text-to-video and LTX-Video text-to-video checked by hand). diffusers
0.42.1 ships blocks for more (Flux Kontext, Flux.2, QwenImage, HunyuanVideo 1.5, Z-Image,
Wan 2.2 and image-to-video, ...): they stay off until someone checks them the same way.
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
    # Pipeline config keys that, when set, make the checkpoint another family's (Wan 2.2's
    # `boundary_ratio` two-expert and `expand_timesteps` TI2V checkpoints load as `WanPipeline`).
    refused_configs: tuple[str, ...] = ()

    @property
    def composed(self) -> bool:
        """True when OmniRT's composed stages run it (no diffusers blocks)."""
        return self.blocks == COMPOSED

    @property
    def tasks(self) -> frozenset[t.Task]:
        """The tasks the family runs in the modular mode."""
        return frozenset(self.workflows)


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
# Wan 2.1 only: a Wan 2.2 checkpoint (two experts, `boundary_ratio` set) needs `Wan22Blocks`.
_WAN = ModularFamily(
    "wan",
    "WanBlocks",
    {t.Task.TEXT2VIDEO: ""},
    output="videos",
    refused_configs=("boundary_ratio", "expand_timesteps"),
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
        "WanPipeline": _WAN,
        "LTXPipeline": _LTX,
        "LTXImageToVideoPipeline": _LTX,
    }
)


def modular_families() -> dict[str, ModularFamily]:
    """Pipeline class name -> the `ModularFamily` that runs it, for every class the mode runs."""
    return dict(_FAMILIES)


def modular_family(pipeline_class: str) -> ModularFamily | None:
    """The family of diffusers pipeline class `pipeline_class`, or None when the mode cannot run it."""
    return _FAMILIES.get(pipeline_class)


def supports_modular(pipeline_class: str, task: t.Task | None = None) -> bool:
    """Whether the modular mode runs `pipeline_class` (and `task` on it, when given)."""
    family = _FAMILIES.get(pipeline_class)
    return family is not None and (task is None or task in family.workflows)
