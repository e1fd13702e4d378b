"""Stable Diffusion text-to-image with classifier-free guidance split across ranks.

The loop is written from the pipeline's components (`encode_prompt`, a fresh scheduler,
`unet`, `scheduler.step`, `vae.decode`) so that the two halves of classifier-free guidance
can run on two ranks: rank 0 predicts the noise for the prompt, rank 1 for the negative
prompt; both predictions are broadcast, and every rank combines them
(`uncond + g * (cond - uncond)`) and steps its own scheduler, so all ranks hold the same
latents at every step (their generators are seeded identically). Rank 0 decodes.

With one rank (or no guidance) rank 0 does what `StableDiffusionPipeline.__call__` does.
Ranks beyond the second only follow along (a pipeline with more branches would use them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class TextJob:
    """One text-to-image request as every rank sees it (plain values only)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 0  # 0 = the model's native size
    height: int = 0
    num_inference_steps: int = 50
    guidance_scale: float = 7.5
    seeds: list[int] = field(default_factory=lambda: [0])
    scheduler: str = ""  # a diffusers scheduler class name; empty = the pipeline's own


class JobRejected(Exception):
    """The job cannot run with this model; `field` names the request field at fault."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass
class Group:
    """This rank's place in the process group; `broadcast` is `torch.distributed.broadcast`."""

    rank: int = 0
    world_size: int = 1
    broadcast: Callable[[torch.Tensor, int], Any] | None = None

    def share(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """`tensor` from rank `src` on every rank (in place)."""
        if self.world_size > 1 and self.broadcast is not None:
            self.broadcast(tensor, src)
        return tensor


StepHook = Callable[[int, int], bool]
"""Called on every rank after each step with (step, total); True stops the job on every rank."""


def fresh_scheduler(pipe: Any, name: str) -> Any:
    """A new scheduler for one job (schedulers keep per-call state)."""
    import diffusers

    base = pipe.scheduler
    cls: Any = type(base)
    if name:
        cls = getattr(diffusers, name, None)
        if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
            raise JobRejected(f"unknown scheduler {name!r} (a diffusers scheduler class name)", "scheduler")
    return cls.from_config(base.config)


@dataclass
class Prepared:
    """What every rank computes before the first step."""

    scheduler: Any
    timesteps: Any
    latents: torch.Tensor
    cond: torch.Tensor
    uncond: torch.Tensor | None
    generators: list[torch.Generator]
    step_kwargs: dict[str, Any]


@torch.inference_mode()
def prepare(pipe: Any, job: TextJob, device: str) -> Prepared:
    """Text encoding, timesteps and initial noise, exactly as the pipeline does them."""
    scale = pipe.vae_scale_factor
    height = job.height or pipe.unet.config.sample_size * scale
    width = job.width or pipe.unet.config.sample_size * scale
    if height % scale or width % scale:
        field_name = "height" if height % scale else "width"
        raise JobRejected(f"{field_name} must be a multiple of {scale}", field_name)
    if job.num_inference_steps < 1:
        raise JobRejected("num_inference_steps must be at least 1", "num_inference_steps")
    do_cfg = job.guidance_scale > 1.0
    count = len(job.seeds)
    cond, uncond = pipe.encode_prompt(
        job.prompt, device, count, do_cfg, negative_prompt=job.negative_prompt or None
    )
    scheduler = fresh_scheduler(pipe, job.scheduler)
    scheduler.set_timesteps(job.num_inference_steps, device=device)
    generators = [torch.Generator(device).manual_seed(seed) for seed in job.seeds]
    from diffusers.utils.torch_utils import randn_tensor

    shape = (count, pipe.unet.config.in_channels, height // scale, width // scale)
    latents = randn_tensor(shape, generator=generators, device=torch.device(device), dtype=cond.dtype)
    latents = latents * scheduler.init_noise_sigma
    accepted = set(inspect.signature(scheduler.step).parameters)
    step_kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        step_kwargs["eta"] = 0.0
    if "generator" in accepted:
        step_kwargs["generator"] = generators
    return Prepared(
        scheduler, scheduler.timesteps, latents, cond, uncond if do_cfg else None, generators, step_kwargs
    )


def _predict(pipe: Any, latents: torch.Tensor, t: Any, embeds: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = pipe.unet(latents, t, encoder_hidden_states=embeds, return_dict=False)[0]
    return out


@torch.inference_mode()
def denoise(pipe: Any, job: TextJob, prep: Prepared, group: Group, on_step: StepHook) -> torch.Tensor | None:
    """The denoising loop; returns the final latents, or None when `on_step` stopped it."""
    scheduler, latents, g = prep.scheduler, prep.latents, job.guidance_scale
    total = len(prep.timesteps)
    for index, t in enumerate(prep.timesteps):
        if prep.uncond is None:  # no guidance: one prediction, made by rank 0
            noise = torch.empty_like(latents)
            if group.rank == 0:
                noise = _predict(pipe, scheduler.scale_model_input(latents, t), t, prep.cond)
            group.share(noise, 0)
        elif group.world_size == 1:  # both halves here, batched like the pipeline
            both = scheduler.scale_model_input(torch.cat([latents] * 2), t)
            uncond, cond = _predict(pipe, both, t, torch.cat([prep.uncond, prep.cond])).chunk(2)
            noise = uncond + g * (cond - uncond)
        else:  # rank 0: the prompt's half, rank 1: the negative prompt's half
            scaled = scheduler.scale_model_input(latents, t)
            cond = _predict(pipe, scaled, t, prep.cond) if group.rank == 0 else torch.empty_like(latents)
            uncond = _predict(pipe, scaled, t, prep.uncond) if group.rank == 1 else torch.empty_like(latents)
            group.share(cond, 0)
            group.share(uncond, 1)
            noise = uncond + g * (cond - uncond)
        latents = scheduler.step(noise, t, latents, **prep.step_kwargs, return_dict=False)[0]
        if on_step(index + 1, total):
            return None
    return latents


@torch.inference_mode()
def decode(pipe: Any, latents: torch.Tensor, generators: list[torch.Generator]) -> list[Any]:
    """Latents to HxWx3 uint8 numpy images, rounded like the pipeline's PIL output."""
    image = pipe.vae.decode(
        latents / pipe.vae.config.scaling_factor, return_dict=False, generator=generators
    )[0]
    arrays = pipe.image_processor.postprocess(image, output_type="np", do_denormalize=[True] * len(latents))
    return [(array * 255).round().astype("uint8") for array in arrays]


def generate(
    pipe: Any, job: TextJob, device: str, group: Group | None = None, on_step: StepHook | None = None
) -> list[Any] | None:
    """One job on one rank: the images on rank 0 (None elsewhere, or when stopped)."""
    group = group or Group()
    prep = prepare(pipe, job, device)
    latents = denoise(pipe, job, prep, group, on_step or (lambda step, total: False))
    if latents is None or group.rank != 0:
        return None
    return decode(pipe, latents, prep.generators)
