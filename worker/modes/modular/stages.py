"""The stages of the `modular` mode for Stable Diffusion 1.x/2.x: encode, prepare, denoise, decode.

diffusers 0.42 ships modular pipelines (`diffusers.modular_pipelines`) for SDXL, SD3, Flux,
Wan, ... but none for SD 1.x, so these stages are composed from the components of the loaded
pipeline: the text encoder and tokenizer (`encode`), the scheduler and UNet with classifier-free
guidance (`denoise`) and the VAE (`decode`). Latent preparation (noise, image latents, mask
latents) calls the task pipeline's own helpers (`prepare_latents`, `get_timesteps`,
`prepare_mask_latents`) in the order its `__call__` does, so that a seed gives the same image
as the `legacy_call` mode. `view` is always a shallow copy of a task pipeline with a fresh
scheduler: the weights are shared, the per-call state is not.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from omnirt import types as t

EncoderAdapters = tuple[tuple[str, float], ...]
"""(path, scale) of each active adapter that changes the text encoder; () for none."""

PromptKey = tuple[str, str, bool, EncoderAdapters]
"""(prompt, negative_prompt, guidance on, text-encoder adapters) — what decides the embeddings."""

Embeds = tuple[torch.Tensor, torch.Tensor | None]
"""(prompt embeddings, negative prompt embeddings or None without guidance), one row."""


K = TypeVar("K")
V = TypeVar("V")


class PromptCache(Generic[K, V]):
    """A thread-safe LRU of prompt embeddings (`size` 0 turns it off).

    The composed stages key it by `PromptKey` and keep `Embeds`; the diffusers blocks key it by
    their text encoder's inputs and keep that block's outputs (`block_run.Outputs`).
    """

    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        self._lock = threading.Lock()
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        """The embeddings of `key` (now most recently used), or None."""
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: K, embeds: V) -> None:
        """Keep `embeds` for `key`, dropping the least recently used entry beyond `size`."""
        if self.size == 0:
            return
        with self._lock:
            self._entries[key] = embeds
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


@torch.inference_mode()
def encode(view: Any, key: PromptKey, device: str) -> Embeds:
    """Run the text encoder (with whatever adapters are active on it): one row of embeddings."""
    prompt, negative, guided, _ = key
    cond, uncond = view.encode_prompt(prompt, device, 1, guided, negative_prompt=negative or None)
    return cond, (uncond if guided else None)


def batch_embeds(rows: Sequence[tuple[Embeds, int]]) -> torch.Tensor:
    """`encoder_hidden_states` for a batch of (embeddings, outputs) rows, in job order.

    Each row is repeated once per output; with guidance all negative rows come first, then all
    prompt rows (the layout of the UNet input `cat([latents] * 2)`).
    """
    conds = torch.cat([cond.repeat_interleave(count, dim=0) for (cond, _), count in rows])
    if all(uncond is None for (_, uncond), _ in rows):
        return conds
    unconds = []
    for (_, uncond), count in rows:
        if uncond is None:
            raise ValueError("a batch mixes jobs with and without classifier-free guidance")
        unconds.append(uncond.repeat_interleave(count, dim=0))
    return torch.cat([*unconds, conds])


@dataclass
class Prepared:
    """What the denoising loop starts from."""

    timesteps: Any
    latents: torch.Tensor
    step_kwargs: dict[str, Any]
    # Inpainting with a 4-channel UNet: the image latents, the noise and the latent mask.
    image_latents: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    masked_image_latents: torch.Tensor | None = None
    timestep_cond: torch.Tensor | None = None


def default_strength(task: t.Task) -> float:
    """diffusers' default strength: 0.8 for image-to-image, 1.0 for inpainting."""
    return 1.0 if task is t.Task.INPAINT else 0.8


@torch.inference_mode()
def prepare(
    view: Any,
    task: t.Task,
    args: dict[str, Any],
    count: int,
    dtype: torch.dtype,
    device: str,
    generators: list[torch.Generator],
) -> Prepared:
    """Timesteps and initial latents for `task` (`args`: width/height/steps/guidance/image/mask/strength)."""
    from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

    steps = int(args.get("num_inference_steps") or 50)
    scale = view.vae_scale_factor
    height = int(args.get("height") or view.unet.config.sample_size * scale)
    width = int(args.get("width") or view.unet.config.sample_size * scale)
    timesteps, steps = retrieve_timesteps(view.scheduler, steps, device)
    step_kwargs = view.prepare_extra_step_kwargs(generators, 0.0)
    prepared: Prepared
    if task is t.Task.TEXT2IMAGE:
        channels = view.unet.config.in_channels
        latents = view.prepare_latents(count, channels, height, width, dtype, device, generators)
        prepared = Prepared(timesteps, latents, step_kwargs)
    else:
        strength = float(args.get("strength", default_strength(task)))
        timesteps, steps = view.get_timesteps(steps, strength, device)
        latent_timestep = timesteps[:1].repeat(count)
        if task is t.Task.IMAGE2IMAGE:
            image = view.image_processor.preprocess(args["image"])
            latents = view.prepare_latents(image, latent_timestep, 1, count, dtype, device, generators)
            prepared = Prepared(timesteps, latents, step_kwargs)
        else:
            prepared = _prepare_inpaint(
                view, args, count, (height, width), latent_timestep, strength, dtype, device, generators
            )
            prepared.timesteps, prepared.step_kwargs = timesteps, step_kwargs
    if view.unet.config.time_cond_proj_dim is not None:  # guidance-distilled UNets (LCM)
        guidance = torch.tensor(float(args.get("guidance_scale", 7.5)) - 1).repeat(count)
        prepared.timestep_cond = view.get_guidance_scale_embedding(
            guidance, embedding_dim=view.unet.config.time_cond_proj_dim
        ).to(device=device, dtype=prepared.latents.dtype)
    return prepared


def _prepare_inpaint(
    view: Any,
    args: dict[str, Any],
    count: int,
    size: tuple[int, int],
    latent_timestep: torch.Tensor,
    strength: float,
    dtype: torch.dtype,
    device: str,
    generators: list[torch.Generator],
) -> Prepared:
    """Inpainting latents, noise, image latents and mask, in `StableDiffusionInpaintPipeline`'s order."""
    height, width = size
    init_image = view.image_processor.preprocess(
        args["image"], height=height, width=width, crops_coords=None, resize_mode="default"
    ).to(dtype=torch.float32)
    four_channels = view.unet.config.in_channels == 4
    out = view.prepare_latents(
        count,
        view.vae.config.latent_channels,
        height,
        width,
        dtype,
        device,
        generators,
        None,
        image=init_image,
        timestep=latent_timestep,
        is_strength_max=strength == 1.0,
        return_noise=True,
        return_image_latents=four_channels,
    )
    mask_condition = view.mask_processor.preprocess(
        args["mask_image"], height=height, width=width, resize_mode="default", crops_coords=None
    )
    masked_image = init_image * (mask_condition < 0.5)
    guided = float(args.get("guidance_scale", 7.5)) > 1.0
    mask, masked_image_latents = view.prepare_mask_latents(
        mask_condition, masked_image, count, height, width, dtype, device, generators, guided
    )
    return Prepared(
        timesteps=None,
        latents=out[0],
        step_kwargs={},
        image_latents=out[2] if four_channels else None,
        noise=out[1],
        mask=mask,
        masked_image_latents=masked_image_latents,
    )


StepCallback = Callable[[int, int, torch.Tensor], None]
"""Called after each step with (step, total, the latents after it); raises to stop the loop."""


@torch.inference_mode()
def denoise(
    view: Any, prepared: Prepared, embeds: torch.Tensor, guidance_scale: float, on_step: StepCallback
) -> torch.Tensor:
    """The denoising loop (scheduler + UNet, classifier-free guidance when `embeds` has both halves)."""
    scheduler, latents = view.scheduler, prepared.latents
    guided = embeds.shape[0] == 2 * latents.shape[0]
    # 9-channel inpainting UNets take the latent mask and masked-image latents as extra channels.
    extra_channels = (
        [prepared.mask, prepared.masked_image_latents]
        if view.unet.config.in_channels == 9
        and prepared.mask is not None
        and prepared.masked_image_latents is not None
        else []
    )
    timesteps = prepared.timesteps
    total = len(timesteps)
    for index, step_t in enumerate(timesteps):
        model_input = torch.cat([latents] * 2) if guided else latents
        model_input = scheduler.scale_model_input(model_input, step_t)
        if extra_channels:
            model_input = torch.cat([model_input, *extra_channels], dim=1)
        noise_pred = view.unet(
            model_input,
            step_t,
            encoder_hidden_states=embeds,
            timestep_cond=prepared.timestep_cond,
            return_dict=False,
        )[0]
        if guided:
            uncond, cond = noise_pred.chunk(2)
            noise_pred = uncond + guidance_scale * (cond - uncond)
        latents = scheduler.step(noise_pred, step_t, latents, **prepared.step_kwargs, return_dict=False)[0]
        if prepared.image_latents is not None and prepared.mask is not None:
            latents = _keep_unmasked(scheduler, prepared, latents, index, guided)
        on_step(index + 1, total, latents)
    return latents


def _keep_unmasked(
    scheduler: Any, prepared: Prepared, latents: torch.Tensor, index: int, guided: bool
) -> Any:
    """4-channel inpainting: outside the mask, the image latents noised to the next timestep."""
    assert prepared.mask is not None and prepared.image_latents is not None
    mask = prepared.mask.chunk(2)[0] if guided else prepared.mask
    proper = prepared.image_latents
    if index < len(prepared.timesteps) - 1:
        proper = scheduler.add_noise(proper, prepared.noise, torch.tensor([prepared.timesteps[index + 1]]))
    return (1 - mask) * proper + mask * latents


@torch.inference_mode()
def decode(view: Any, latents: torch.Tensor, generators: list[torch.Generator]) -> list[Any]:
    """Latents to PIL images through the VAE, post-processed like the pipeline's PIL output."""
    image = view.vae.decode(
        latents / view.vae.config.scaling_factor, return_dict=False, generator=generators
    )[0]
    images: list[Any] = view.image_processor.postprocess(
        image, output_type="pil", do_denormalize=[True] * image.shape[0]
    )
    return images
