"""The "pipeline" program: any diffusers pipeline through its own `__call__`, on every rank.

A request of this program is the daemon's `ItemPlan`s of one batch (jobs that may share a
call) and the catalog's `runtime.parallel`. Every rank:

1. checks each plan against its task's pipeline (the loaded one, or for image2image, inpaint
   and image2video on a text-to-X model one built on its modules, `tasks.pipeline_for_task`)
   with legacy_call's own code (`tasks.check_size`, `args.pipeline_kwargs`: the request's
   extras by the pipeline's signature and `check_call_arguments`' refusals, its media inputs
   decoded from the bytes the daemon shipped (`inputs`), `args.check_arguments`,
   `tasks.check_audio`), so a field the family cannot take is INVALID_ARGUMENT naming it, as
   in legacy_call; a refused plan fails alone, the others run;
2. cuts the batch's outputs (one per seed, in job order) into this rank's share by the kind:
   `cfg`, `ulysses` and `ring` make every output on every rank (one call, the same seeds
   everywhere: the ranks share the work inside it), `data` gives each rank a contiguous share
   (`data_parallel.share_of`), `none` gives rank 0 everything;
3. calls the pipeline with the arguments legacy_call builds for those outputs (`call_kwargs`
   of the plans' common, specific and prompt arguments, one generator per output), its own
   fresh scheduler, under inference mode; with `cfg` the denoisers carry a `GuidanceSplit`.
   A rank whose images nobody reads (ranks 1 and up when every rank makes every output) asks
   for `output_type="latent"` and skips the VAE decode.
   An inpaint's outputs get the input pasted back outside the mask, as in legacy_call
   (`tasks.finish_outputs`).

The caller (`rank.Rank.run_call`) supplies the step callback (progress, the stop agreement and
the split's step ends) and gathers the shares on rank 0.
"""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any

from omnirt import types as t
from omnirt.worker.failures import JobFailure
from omnirt.worker.modes.events import StepHook, attach_step_hook
from omnirt.worker.modes.legacy_call import prompt_kwargs
from omnirt.worker.modes.persistent.guidance_split import GuidanceSplit
from omnirt.worker.modes.schedulers import call_view, fresh_scheduler, seed_noise_sampler
from omnirt.worker.pipelines import clip_skip, media_inputs
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import (
    ItemPlan,
    call_kwargs,
    call_parameters,
    check_arguments,
    pipeline_kwargs,
)
from omnirt.worker.pipelines.previews import PreviewMaker
from omnirt.worker.runtime import inference_mode

Output = tuple[int, int]
"""(index of the plan in the request, index of the output in the plan)."""

# Kinds where every rank makes every output (the ranks share the work inside the call).
EVERY_RANK = frozenset({"cfg", "ulysses", "ring"})

StepEnd = StepHook


def check_plans(pipe: Any, plans: list[ItemPlan], spec: t.ModelSpec) -> dict[int, t.JobError]:
    """legacy_call's checks of each plan against its task's pipeline on `pipe` (filling
    `plan.specific`, media inputs decoded); the refused ones."""
    refused: dict[int, t.JobError] = {}
    for index, plan in enumerate(plans):
        try:
            task_pipe = task_pipelines.pipeline_for_task(pipe, plan.task, spec)
            task_pipelines.check_size(task_pipe, plan.common)
            # The daemon read every file:// input into bytes (`inputs.shipped`): none is read here.
            pipeline_kwargs(plan, call_parameters(task_pipe), media_inputs.InputPolicy())
            check_arguments(task_pipe, plan)
            task_pipelines.check_audio(task_pipe, plan.task, plan.specific, plan.output_format)
        except JobFailure as failure:
            refused[index] = failure.error
    return refused


def outputs_of(plans: list[ItemPlan], runnable: list[int]) -> list[Output]:
    """Every output of the runnable plans, in plan order."""
    return [(j, k) for j in runnable for k in range(plans[j].num_outputs)]


def share_of(parallel: str, outputs: list[Output], rank: int, world_size: int) -> list[Output]:
    """The outputs rank `rank` makes for `parallel`."""
    from omnirt.worker.modes.persistent import data_parallel

    if parallel == "data":
        return data_parallel.share_of(outputs, rank, world_size)
    if parallel in EVERY_RANK:
        return list(outputs)
    return list(outputs) if rank == 0 else []  # "none": rank 0 alone


def call_plans(plans: list[ItemPlan], share: list[Output]) -> list[ItemPlan]:
    """The plans of `share` as legacy_call would group them: a whole job as itself (one prompt,
    its count), else one plan of one output per output (prompts repeated, in order)."""
    jobs = {j for j, _ in share}
    if len(jobs) == 1:
        (j,) = jobs
        if len(share) == plans[j].num_outputs:
            return [plans[j]]
    if len(share) == sum(plans[j].num_outputs for j in jobs):
        return [plans[j] for j in sorted(jobs)]
    return [dataclasses.replace(plans[j], num_outputs=1, seeds=[plans[j].seeds[k]]) for j, k in share]


def run_share(
    pipe: Any,
    plans: list[ItemPlan],
    spec: t.ModelSpec,
    share: list[Output],
    device: str,
    step_end: StepEnd,
    split: GuidanceSplit | None = None,
    decode: bool = True,
) -> tuple[list[Any], dict[str, Any]]:
    """One pipeline call for `share`; its outputs (images, frame arrays or clips; none when not
    `decode`) and facts for the report."""
    import torch

    group = call_plans(plans, share)
    first = group[0]
    pipe = task_pipelines.pipeline_for_task(pipe, first.task, spec)  # image2image, inpaint: from_pipe
    # As legacy_call: a shallow copy with its own scheduler (schedulers keep per-call state).
    view = call_view(pipe)
    scheduler, warnings = fresh_scheduler(pipe.scheduler, first.scheduler)
    if type(scheduler) is type(pipe.scheduler):
        object.__setattr__(view, "scheduler", scheduler)
    else:
        view.scheduler = scheduler
    accepted = call_parameters(view)
    generic = {**first.common, **first.specific, **prompt_kwargs(group)}
    if first.fps:
        generic["fps"] = first.fps
    kwargs = call_kwargs(generic, accepted)
    seeds = [seed for p in group for seed in p.seeds]
    kwargs["generator"] = [torch.Generator(device).manual_seed(seed) for seed in seeds]
    seed_noise_sampler(view.scheduler, seeds)
    attach_step_hook(view, accepted, kwargs, step_end)
    if not decode and "output_type" in accepted:
        kwargs["output_type"] = "latent"
    hooked = split.installed(view) if split is not None else nullcontext()
    with (
        clip_skip.text_model_view(view, kwargs),
        inference_mode.call_context(inference_mode.use_inference_mode(view, None)),
        hooked,
    ):
        output = view(**kwargs)
    info = {
        "scheduler": type(view.scheduler).__name__,
        "warnings": warnings,
        "pipeline_class": type(pipe).__name__,
    }
    if not decode:
        return [], info
    made = task_pipelines.call_outputs(output, view)
    made = task_pipelines.finish_outputs(first.task, made, first.specific, spec.runtime)  # inpaint overlay
    if len(made) != len(share):
        raise JobFailure("INTERNAL", f"the pipeline returned {len(made)} outputs, expected {len(share)}")
    return made, info


def preview_maker(settings: Any, spec: t.ModelSpec, plans: list[ItemPlan]) -> PreviewMaker | None:
    """The call's preview maker (the model's normalized `preview` option), or None when off."""
    if not settings:
        return None
    common = plans[0].common
    return PreviewMaker(settings, spec.family, int(common.get("width") or 0), int(common.get("height") or 0))


def previews_of(maker: PreviewMaker, pipe: Any, latents: Any, share: list[Output]) -> list[Any]:
    """`[(plan index, bytes, mime type), ...]`: a preview of each plan's first output in this
    rank's `share` (the call's batch is in share order)."""
    firsts: dict[int, int] = {}
    for position, (j, _) in enumerate(share):
        firsts.setdefault(j, position)
    made = maker.make(pipe, latents, list(firsts.values()))
    return [(j, p.data, p.mime_type) for j, p in zip(firsts, made, strict=True) if p is not None]
