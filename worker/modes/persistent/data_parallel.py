"""Stable Diffusion text-to-image with a batch split across ranks (data parallel).

A batch of compatible jobs (same size, steps, guidance and scheduler; prompts and seeds
differ) is flattened into its outputs, one per seed, in job order, and cut into one contiguous
share per rank. Each rank encodes the prompts of its share, draws each output's noise from
that output's own generator (so an output is the same whichever rank makes it), runs the
denoising loop with classifier-free guidance batched locally (as `StableDiffusionPipeline`
does) and decodes; rank 0 gathers the images. The ranks step in lockstep (one stop check per
step on every rank, a rank with an empty share included), so a cancel stops them all.

Used by the rank program for requests with `"program": "data_parallel"`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from omnirt.worker.modes.persistent.cfg_denoise import JobRejected, StepHook, TextJob, decode, fresh_scheduler

Output = tuple[int, int]
"""(index of the job in the batch, index of the output in the job)."""


def outputs_of(jobs: list[TextJob]) -> list[Output]:
    """Every output of the batch, in job order."""
    return [(j, k) for j, job in enumerate(jobs) for k in range(len(job.seeds))]


def share_of(outputs: list[Output], rank: int, world_size: int) -> list[Output]:
    """The contiguous part of `outputs` rank `rank` makes: sizes differ by at most one, the
    lower ranks take the extra ones (rank 0 keeps its images: nothing to send)."""
    base, extra = divmod(len(outputs), world_size)
    start = rank * base + min(rank, extra)
    return outputs[start : start + base + (1 if rank < extra else 0)]


@dataclass
class Prepared:
    """One rank's share, ready for the first step."""

    share: list[Output]
    scheduler: Any
    timesteps: Any
    latents: torch.Tensor | None  # None for an empty share
    embeds: torch.Tensor | None  # [uncond..., cond...] with guidance
    generators: list[torch.Generator]
    step_kwargs: dict[str, Any]
    guided: bool


def check_batch(pipe: Any, jobs: list[TextJob]) -> None:
    """JobRejected unless the jobs can run as one batch on this model."""
    if not jobs:
        raise JobRejected("a data-parallel request needs at least one job", "")
    first = jobs[0]
    for job in jobs[1:]:
        for name in ("width", "height", "num_inference_steps", "guidance_scale", "scheduler"):
            if getattr(job, name) != getattr(first, name):
                raise JobRejected(f"the jobs of a data-parallel batch differ in {name}", name)
    scale = pipe.vae_scale_factor
    height = first.height or pipe.unet.config.sample_size * scale
    width = first.width or pipe.unet.config.sample_size * scale
    if height % scale or width % scale:
        name = "height" if height % scale else "width"
        raise JobRejected(f"{name} must be a multiple of {scale}", name)
    if first.num_inference_steps < 1:
        raise JobRejected("num_inference_steps must be at least 1", "num_inference_steps")


@torch.inference_mode()
def prepare(pipe: Any, jobs: list[TextJob], share: list[Output], device: str) -> Prepared:
    """This rank's prompt embeddings, noise, scheduler and timesteps."""
    from diffusers.utils.torch_utils import randn_tensor

    check_batch(pipe, jobs)
    first = jobs[0]
    guided = first.guidance_scale > 1.0
    scheduler = fresh_scheduler(pipe, first.scheduler)
    scheduler.set_timesteps(first.num_inference_steps, device=device)
    generators = [torch.Generator(device).manual_seed(jobs[j].seeds[k]) for j, k in share]
    accepted = set(inspect.signature(scheduler.step).parameters)
    step_kwargs: dict[str, Any] = {}
    if "eta" in accepted:
        step_kwargs["eta"] = 0.0
    if "generator" in accepted:
        step_kwargs["generator"] = generators
    if not share:
        return Prepared(share, scheduler, scheduler.timesteps, None, None, [], step_kwargs, guided)
    encoded: dict[int, torch.Tensor] = {}
    negatives: dict[int, torch.Tensor] = {}  # with guidance only
    for j in sorted({j for j, _ in share}):
        job = jobs[j]
        cond, uncond = pipe.encode_prompt(
            job.prompt, device, 1, guided, negative_prompt=job.negative_prompt or None
        )
        encoded[j] = cond
        if uncond is not None:
            negatives[j] = uncond
    conds = torch.cat([encoded[j] for j, _ in share])
    embeds = conds
    if guided:
        embeds = torch.cat([torch.cat([negatives[j] for j, _ in share]), conds])
    scale = pipe.vae_scale_factor
    height = (first.height or pipe.unet.config.sample_size * scale) // scale
    width = (first.width or pipe.unet.config.sample_size * scale) // scale
    shape = (len(share), pipe.unet.config.in_channels, height, width)
    latents = randn_tensor(shape, generator=generators, device=torch.device(device), dtype=conds.dtype)
    latents = latents * scheduler.init_noise_sigma
    return Prepared(share, scheduler, scheduler.timesteps, latents, embeds, generators, step_kwargs, guided)


@torch.inference_mode()
def denoise(pipe: Any, guidance_scale: float, prep: Prepared, on_step: StepHook) -> torch.Tensor | None:
    """The loop on this rank's share; None when `on_step` (a collective) said stop."""
    scheduler, latents = prep.scheduler, prep.latents
    total = len(prep.timesteps)
    for index, t in enumerate(prep.timesteps):
        if latents is not None and prep.embeds is not None:
            model_input = torch.cat([latents] * 2) if prep.guided else latents
            model_input = scheduler.scale_model_input(model_input, t)
            noise = pipe.unet(model_input, t, encoder_hidden_states=prep.embeds, return_dict=False)[0]
            if prep.guided:
                uncond, cond = noise.chunk(2)
                noise = uncond + guidance_scale * (cond - uncond)
            latents = scheduler.step(noise, t, latents, **prep.step_kwargs, return_dict=False)[0]
        if on_step(index + 1, total):  # every rank, every step: they stop together
            return None
    return latents if latents is not None else torch.empty(0)


def generate_share(
    pipe: Any, jobs: list[TextJob], prep: Prepared, on_step: StepHook
) -> list[tuple[Output, Any]] | None:
    """This rank's images as ((job, output), HxWx3 uint8); None when stopped."""
    latents = denoise(pipe, jobs[0].guidance_scale, prep, on_step)
    if latents is None:
        return None
    if not prep.share:
        return []
    images = decode(pipe, latents, prep.generators)
    return list(zip(prep.share, images, strict=True))
