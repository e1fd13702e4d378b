"""One batch of jobs through a diffusers `ModularPipeline`, sub-block by sub-block, stage by stage.

The pipeline's top-level sub-blocks (its workflow's blocks) run one after another on one shared
`PipelineState`, as `SequentialPipelineBlocks` runs them, and map to OmniRT's stages by their
name in diffusers' blocks: `text_encoder` (and prompt up-samplers) is `encode`, `decode` is
`decode`, everything between (image/VAE encoding, latent and timestep preparation, the denoising
loop) is `denoise`; `export` follows outside. Each stage is a STAGE event pair and a timing.

`encode` runs once per distinct prompt of the batch (alone, so its embeddings are the same bits
whatever batch asked for them) unless the prompt cache has them: then the text encoder does not
run and the cached block outputs go into the state, with their `kwargs_type` (the denoiser's
input group). Key: every text-encoder block input the job sets (prompt, negative prompt, extras
such as `max_sequence_length`), whether guidance is on, and the text-encoder adapters; the cache
itself is per loaded model, i.e. per text encoder.

A batch is one pass when every text-encoder output is a tensor with one row per prompt (SDXL,
Flux, SD3, Wan and LTX's are): each job's rows are repeated once per output and concatenated,
with `num_images_per_prompt = 1` and one generator per output, so each output's noise is its
seed's. Otherwise the jobs of the batch run one after another (their encodes still in one stage).

Classifier-free guidance is the pipeline's `guider` component: each call gets a guider of its
own (it keeps per-step state), off for guidance_scale <= 1 as `legacy_call`'s pipelines do; Flux
takes `guidance_scale` as a block input (its guidance embedding) instead.
"""

from __future__ import annotations

import copy
import functools
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from omnirt.worker.failures import JobFailure, StopRun
from omnirt.worker.modes.events import RunRecorder, first_outputs, send_previews
from omnirt.worker.modes.executor import StopCheck
from omnirt.worker.modes.modular import stages
from omnirt.worker.modes.modular.families import ModularFamily
from omnirt.worker.modes.modular.pipelines import STEP_CALLBACK
from omnirt.worker.modes.schedulers import own_tokenizers
from omnirt.worker.pipelines.args import ItemPlan, call_kwargs
from omnirt.worker.pipelines.previews import PreviewMaker

ENCODE_BLOCKS = frozenset({"text_encoder", "prompt_upsampler", "prompt_upsample", "prompt_enhancer"})
DECODE_BLOCKS = frozenset({"decode", "after_decode"})
STAGE_ORDER = ("encode", "denoise", "decode")
# Call arguments whose default the blocks declare differently from the pipelines (the guider's
# 7.5 against SDXL's 5.0, SDXL inpainting's strength 0.9999 against the blocks' 0.3): when a
# request leaves one unset, the `legacy_call` pipeline's own default is used, so both modes
# make the same image of the same request (Qwen-Image's prompt is cut at 512 tokens, not 1024).
LEGACY_DEFAULTS = ("num_inference_steps", "guidance_scale", "strength", "output_type", "max_sequence_length")

Outputs = dict[str, tuple[Any, str | None]]
"""The text encoder blocks' outputs: name -> (value, kwargs_type) as they go into the state."""


def stage_of(block_name: str) -> str:
    """OmniRT's stage of a top-level sub-block (`denoise.input` -> denoise)."""
    top = block_name.split(".", 1)[0]
    if top in ENCODE_BLOCKS:
        return "encode"
    return "decode" if top in DECODE_BLOCKS else "denoise"


def stage_blocks(pipeline: Any) -> dict[str, list[tuple[str, Any]]]:
    """The pipeline's top-level sub-blocks by stage, in order (JobFailure if the stages interleave)."""
    # `pipeline.blocks` deep-copies the blocks on every read; `_blocks` is the one it runs.
    blocks = pipeline._blocks
    by_stage: dict[str, list[tuple[str, Any]]] = {name: [] for name in STAGE_ORDER}
    last = 0
    for name, block in blocks.sub_blocks.items():
        stage = stage_of(name)
        at = STAGE_ORDER.index(stage)
        if at < last:
            reason = f"{type(blocks).__name__}: block {name!r} ({stage}) after a later stage"
            raise JobFailure("INTERNAL", reason)
        last = at
        by_stage[stage].append((name, block))
    return by_stage


def input_names(pipeline: Any) -> frozenset[str]:
    """The inputs the pipeline's blocks take."""
    return frozenset(p.name for p in pipeline._blocks.inputs if p.name)


def accepted_arguments(pipeline: Any, family: ModularFamily) -> frozenset[str]:
    """What a request may set on this pipeline: its inputs, and guidance_scale through a guider
    (Wan 2.2's low-noise expert's `guidance_scale_2` through its `guider_2`)."""
    names = set(input_names(pipeline))
    if getattr(pipeline, "guider", None) is not None and family.takes_guidance_scale:
        names |= {"guidance_scale", "guidance_rescale"}
        if getattr(pipeline, "guider_2", None) is not None:
            names.add("guidance_scale_2")
    return frozenset(names)


@functools.lru_cache(maxsize=256)
def _defaults(function: Any) -> dict[str, Any]:
    parameters = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in parameters if p.name in LEGACY_DEFAULTS and p.default is not p.empty}


def legacy_defaults(legacy: Any) -> dict[str, Any]:
    """The defaults of `LEGACY_DEFAULTS` in the `legacy_call` pipeline's `__call__`."""
    call = type(legacy).__call__
    return _defaults(call) if inspect.isfunction(call) else {}


def initial_state(pipeline: Any, values: dict[str, Any]) -> Any:
    """A `PipelineState` with every input of the blocks: `values`, else the input's default
    (what `ModularPipeline.__call__` does before it runs the blocks)."""
    from diffusers.modular_pipelines import PipelineState

    state = PipelineState()
    for param in pipeline._blocks.inputs:
        if param.name:
            state.set(param.name, values.get(param.name, param.default), param.kwargs_type)
    return state


def batch_outputs(rows: Sequence[tuple[Outputs, int]]) -> Outputs | None:
    """The outputs of several prompts as one batch (each repeated per output), or None when an
    output has no row per prompt (then the batch cannot be one pass)."""
    merged: Outputs = {}
    for name, (_, kind) in rows[0][0].items():
        values = [outputs.get(name, (None, kind))[0] for outputs, _ in rows]
        if all(v is None for v in values):
            merged[name] = (None, kind)
            continue
        if not all(isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == 1 for v in values):
            return None
        if len({v.shape for v in values}) != 1:
            return None
        repeated = [v.repeat_interleave(n, dim=0) for v, (_, n) in zip(values, rows, strict=True)]
        merged[name] = (torch.cat(repeated), kind)
    return merged


@dataclass
class BlocksResult:
    """What the pass made: images per job (None: stopped), report facts, cache hits per job."""

    images: dict[str, list[Any] | None] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    steps: int = 0


class BlocksGroup:
    """Runs one group of compatible plans (same task and settings) through `pipeline`."""

    def __init__(
        self,
        pipeline: Any,
        family: ModularFamily,
        legacy: Any,
        *,
        recorder: RunRecorder,
        stop: StopCheck,
        device: str,
        cache: stages.PromptCache[Any, Outputs],
        encoder_variant: tuple[tuple[str, float], ...],
        view_setup: Callable[[Any], None],
        previews: PreviewMaker | None = None,
        after_step: Callable[[int, int], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.legacy = legacy  # the family's pipeline class: how a preview unpacks packed latents
        self.previews = previews
        self.family = family
        self.recorder = recorder
        self.stop = stop
        self.device = device
        self.cache = cache
        self.variant = encoder_variant
        self.view_setup = view_setup
        self.after_step = after_step  # (step, total) after each step's checks (the step engine)
        self.inputs = input_names(pipeline)
        self.legacy_defaults = legacy_defaults(legacy)
        self.by_stage = stage_blocks(pipeline)
        self.result = BlocksResult()

    # ---- one call's pipeline ---------------------------------------------------------------

    def _view(self, args: dict[str, Any]) -> Any:
        """A shallow copy of the pipeline with a guider and scheduler of its own (per-call state)."""
        view = copy.copy(self.pipeline)
        guider = getattr(self.pipeline, "guider", None)
        if guider is not None:
            scale = float(args.get("guidance_scale", guider.guidance_scale))
            rescale = float(args.get("guidance_rescale", 0.0))
            view.guider = type(guider).from_config(
                guider.config, guidance_scale=scale, guidance_rescale=rescale, enabled=scale > 1.0
            )
            # Wan 2.2's low-noise expert: `guidance_scale_2`, else guidance_scale (the pipeline's
            # default), and no guidance when the high-noise one has none (the pipeline's CFG switch).
            second = getattr(self.pipeline, "guider_2", None)
            if second is not None:
                scale_2 = float(args.get("guidance_scale_2", scale))
                view.guider_2 = type(second).from_config(
                    second.config,
                    guidance_scale=scale_2,
                    guidance_rescale=rescale,
                    enabled=scale > 1.0 and scale_2 > 1.0,
                )
        self.view_setup(view)
        return view

    def _args(self, plan: ItemPlan) -> dict[str, Any]:
        args = {**plan.common, **plan.specific}
        for name, value in self.legacy_defaults.items():
            if value is not None:
                args.setdefault(name, value)
        # Qwen-Image's pipeline (guidance_scale None: its CFG is `true_cfg_scale`, 4.0 as the
        # blocks' guider) runs CFG only with a negative prompt: without either, no guidance.
        unset = self.legacy_defaults.get("guidance_scale", 0) is None and "guidance_scale" not in args
        if unset and not plan.item.request.negative_prompt:
            args["guidance_scale"] = 1.0
        args.setdefault("output_type", "pil")
        return args

    def _call_values(self, plan: ItemPlan, args: dict[str, Any]) -> dict[str, Any]:
        """`args` under the blocks' input names (`legacy_call`'s table: the fps is LTX's
        `frame_rate`, the count `num_videos_per_prompt` for video blocks), as the pipeline gets them."""
        generic = {**args, "fps": plan.fps} if plan.fps else args
        return {k: v for k, v in call_kwargs(generic, self.inputs).items() if k in self.inputs}

    # ---- encode --------------------------------------------------------------------------

    def _prompt_values(self, plan: ItemPlan) -> dict[str, Any]:
        req = plan.item.request
        values: dict[str, Any] = {"prompt": req.prompt}
        if "negative_prompt" in self.inputs:
            values["negative_prompt"] = req.negative_prompt or self.family.empty_negative_prompt
        return values

    def _encode(self, view: Any, plan: ItemPlan, args: dict[str, Any], guided: bool) -> Outputs:
        """The text encoder blocks' outputs for `plan`'s prompt (from the cache, or encoded now)."""
        blocks = self.by_stage["encode"]
        values = {**self._call_values(plan, args), **self._prompt_values(plan)}
        names = sorted({p.name for _, block in blocks for p in block.inputs if p.name})
        key = (tuple((n, repr(values[n])) for n in names if values.get(n) is not None), guided, self.variant)
        found = self.cache.get(key)
        self.result.hits[plan.job_id] = 0 if found is None else 1
        if found is not None:
            return found
        state = initial_state(view, values)
        with torch.no_grad():
            for _, block in blocks:
                _, state = block(view, state)
        outputs: Outputs = {
            out.name: (state.get(out.name), out.kwargs_type)
            for _, block in blocks
            for out in block.intermediate_outputs
            if out.name
        }
        self.cache.put(key, outputs)
        return outputs

    # ---- the pass ------------------------------------------------------------------------

    def run(self, group: list[ItemPlan]) -> BlocksResult:
        """Encode every job of `group`, then denoise and decode it as one pass (or job by job)."""
        job_ids = [p.job_id for p in group]
        first_args = self._args(group[0])
        view = self._view(first_args)
        guided = getattr(view, "guider", None) is not None and view.guider.num_conditions > 1

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "encode")
        with own_tokenizers(view):  # another call may encode on this pipeline at the same time
            rows = [(self._encode(view, plan, self._args(plan), guided), plan.num_outputs) for plan in group]
        self.recorder.stage_finished(job_ids, "encode", started)
        self._check_stop(job_ids)

        merged = batch_outputs(rows) if len(group) > 1 else None
        if len(group) == 1 or merged is not None:
            self._denoise_decode(view, group, merged or rows[0][0], first_args, single=len(group) == 1)
        else:  # no row per prompt in some output: one pass per job, in order
            for plan, (outputs, _) in zip(group, rows, strict=True):
                try:
                    self._denoise_decode(self._view(first_args), [plan], outputs, first_args, single=True)
                except StopRun:
                    self.result.images[plan.job_id] = None
        return self.result

    def _check_stop(self, job_ids: list[str]) -> None:
        if self.stop.all_stopped(job_ids):
            raise StopRun()

    def _denoise_decode(
        self, view: Any, group: list[ItemPlan], outputs: Outputs, args: dict[str, Any], *, single: bool
    ) -> None:
        job_ids = [p.job_id for p in group]
        values = self._call_values(group[0], args)
        if single:  # the blocks repeat the job's rows per output themselves
            values.update(self._prompt_values(group[0]))
            count = group[0].num_outputs
        else:
            prompts = [p.item.request.prompt for p in group for _ in range(p.num_outputs)]
            values["prompt"] = prompts
            count = 1
        values.update(call_kwargs({"num_images_per_prompt": count}, self.inputs))
        # One generator per output, in job order: each output's noise is its seed's, batched or not.
        values["generator"] = [torch.Generator(self.device).manual_seed(s) for p in group for s in p.seeds]
        state = initial_state(view, values)
        for name, (value, kind) in outputs.items():
            state.set(name, value, kind)

        steps = [0]
        firsts = first_outputs([p.num_outputs for p in group])

        def on_step(block_state: Any) -> None:
            steps[0] += 1
            timesteps = getattr(block_state, "timesteps", None)
            total = len(timesteps) if timesteps is not None else int(block_state.num_inference_steps)
            self.recorder.progress(job_ids, steps[0], max(total, steps[0]))
            self._check_stop(job_ids)
            if self.previews is not None and self.previews.due(steps[0], total):
                latents = getattr(block_state, "latents", None)
                send_previews(
                    self.recorder,
                    self.stop,
                    self.previews,
                    self.legacy,
                    latents,
                    steps[0],
                    total,
                    job_ids,
                    firsts,
                )
            if self.after_step is not None:
                self.after_step(steps[0], total)

        setattr(view, STEP_CALLBACK, on_step)
        with torch.no_grad():
            for stage in ("denoise", "decode"):
                started = time.perf_counter()
                self.recorder.stage_started(job_ids, stage)
                for _, block in self.by_stage[stage]:
                    _, state = block(view, state)
                self.recorder.stage_finished(job_ids, stage, started)
                if stage == "denoise":
                    self._check_stop(job_ids)
        self.result.steps = steps[0]
        made = list(state.get(self.family.output))
        expected = sum(p.num_outputs for p in group)
        if len(made) != expected:
            raise JobFailure("INTERNAL", f"the blocks made {len(made)} outputs, expected {expected}")
        at = 0
        for plan in group:
            self.result.images[plan.job_id] = made[at : at + plan.num_outputs]
            at += plan.num_outputs
