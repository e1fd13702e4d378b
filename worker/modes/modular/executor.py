"""`ModularExecutor`: the `modular` execution mode, a model run stage by stage from shared components.

A family's components (UNet or transformer, VAE, text encoders, tokenizers, scheduler) are
loaded once per worker by the model cache (keyed by source, so every catalog entry on
`builtin:tiny-sd` shares them) and every task uses them. Two kinds of families
(`families.py` says which pipeline class is which; any other is refused with
FAILED_PRECONDITION naming the model, before it loads):

- Families with Modular Diffusers blocks (SDXL, Flux, FLUX.2, SD3, Qwen-Image, Wan 2.1 and 2.2,
  HunyuanVideo 1.5, LTX-Video): each task runs
  diffusers' own `ModularPipeline` of the family's blocks (the task's workflow), whose
  components are the model cache's modules, registered in the worker's one `ComponentsManager`
  (`pipelines.py`, with the per-family `block_fixes.py` where diffusers' blocks differ from its
  pipelines); the blocks run sub-block by sub-block (`block_run.py`).
- Stable Diffusion 1.x/2.x (diffusers 0.42 has no blocks for it): image2image and inpaint
  pipelines are `from_pipe` views of the loaded one, and the stages are composed in `stages.py`.

Both have the stages `encode` (text encoder, skipped on a prompt-embedding cache hit), `denoise`
(one PROGRESS event, one stop check per step), `decode` (VAE) and `export`, each a STAGE event
pair and a `RunReport.timings` entry.

Batches: the jobs of an assignment are grouped like `legacy_call` groups them (same task, size,
steps, guidance, scheduler, extras and adapters; media inputs never batch) and each group runs
as ONE pass through the stages: every prompt is encoded (or found in the cache) on its own,
then one denoising loop runs over the concatenated latents (one generator per output, so each
job's noise is what it would be alone) and one VAE decode (the diffusers blocks get the batch's
embeddings concatenated, one row per output; see `block_run.py`). A cancelled job's result is dropped;
the others of its batch run on unchanged (their rows do not depend on it) and the loop stops
only when every job of the batch must stop.

Adapters (LoRA): applied with `adapters.applied` on the shared modules for the whole pass and
turned off afterwards; a pass without adapters holds the components in shared mode, so it never
runs while another job's adapters are active. An adapter that changes the text encoder is part
of the prompt-cache key; a UNet-only adapter is not (its prompts embed like plain ones).

Runtime options (`ModelSpec.runtime`): `prompt_cache_size` (default 256; 0 = no cache); the
load options and VAE slicing/tiling as in `legacy_call` (not `step_cache`, nor options per
request). Loading, planning, grouping, media decoding, export and the RunReport are the shared
`AssignmentRun`'s (`omnirt.worker.modes.assignment`), as in `legacy_call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.export import outputs as output_export
from omnirt.worker.failures import JobFailure, StopRun, stop_error
from omnirt.worker.modes import step_engine
from omnirt.worker.modes.assignment import AssignmentRun
from omnirt.worker.modes.events import first_outputs, send_previews
from omnirt.worker.modes.executor import CancelFlags, EventSink
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular import stages
from omnirt.worker.modes.modular.families import ModularFamily, modular_families, modular_family
from omnirt.worker.modes.schedulers import fresh_scheduler, own_tokenizers, seed_noise_sampler
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import MEDIA_ARGUMENTS, ItemPlan, check_call_arguments
from omnirt.worker.pipelines.loader import CacheKey
from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache
from omnirt.worker.pipelines.previews import PreviewMaker
from omnirt.worker.runtime import adapters, inference_mode
from omnirt.worker.runtime import options as runtime_options

if TYPE_CHECKING:
    from omnirt.worker.modes.modular.pipelines import ModularPipelines

log = logging.getLogger(__name__)

MODE = ExecutionMode.MODULAR
DEFAULT_PROMPT_CACHE_SIZE = 256
PROMPT_CACHE = "prompt_embeds"
STEP_CACHE = "step_cache"  # diffusers cache hooks: legacy_call only


def prompt_cache_size(spec: t.ModelSpec) -> int:
    """`runtime.prompt_cache_size` of `spec` (default 256); JobFailure when it is not an integer >= 0."""
    value = spec.runtime.get("prompt_cache_size", DEFAULT_PROMPT_CACHE_SIZE)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise JobFailure(
            "FAILED_PRECONDITION", f"runtime.prompt_cache_size must be an integer >= 0 (got {value!r})"
        )
    return value


def encoder_adapters(view: Any, active: Sequence[adapters.ResolvedAdapter]) -> stages.EncoderAdapters:
    """The active adapters that change one of `view`'s text encoders (loaded ones only), as a
    cache-key part."""
    on_encoder: set[str] = set()
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        on_encoder.update(getattr(getattr(view, name, None), "peft_config", None) or {})
    return tuple((str(a.path), a.scale) for a in active if a.adapter_name in on_encoder)


def modular_refusal(spec: t.ModelSpec, pipeline_class: str, loaded: Any = None) -> JobFailure | None:
    """FAILED_PRECONDITION (field `model`) when the modular mode cannot run `pipeline_class`
    (or the `loaded` pipeline's checkpoint, whose config may make it another family's)."""
    if not pipeline_class or pipeline_class == "DiffusionPipeline":
        return None  # a generic class: known once loaded, checked again then
    config = getattr(loaded, "config", None) or {}
    family = modular_family(pipeline_class, config)
    if family is not None:
        refused = family.refused(config)
        if not refused:
            return None
        what = f"{pipeline_class} with {', '.join(refused)} set"
    else:
        what = pipeline_class
    known = modular_families().values()
    runs = sorted({f.name for f in known} | {other.name for f in known for _, other in f.by_config})
    return JobFailure(
        "FAILED_PRECONDITION",
        f"model {spec.id!r} ({what}) cannot run in the {MODE} mode: it runs the families diffusers "
        f"has modular blocks for ({', '.join(runs)}); serve it with execution_mode = 'legacy_call'",
        "model",
    )


class ModularExecutor(LegacyCallExecutor):
    """Runs assignments stage by stage on components shared by all tasks of a model family."""

    mode = MODE

    def __init__(self, config: WorkerConfig, cache: ModelCache | None = None) -> None:
        super().__init__(config, cache)
        self._caches_lock = threading.Lock()
        self._prompt_caches: dict[CacheKey, stages.PromptCache[Any, Any]] = {}
        self._modular: ModularPipelines | None = None

    @property
    def modular(self) -> ModularPipelines:
        """The worker's `ComponentsManager` and modular pipelines (diffusers is imported on first use)."""
        with self._caches_lock:
            if self._modular is None:
                from omnirt.worker.modes.modular.pipelines import ModularPipelines

                self._modular = ModularPipelines()
            return self._modular

    def step_engine(self) -> tuple[int, list[str]]:
        """The step engine's pipelines that this mode runs through diffusers' blocks (its composed
        stages, SD 1.x's, run each call alone)."""
        rows, pipelines = super().step_engine()
        blocks = [p for p in pipelines if (f := modular_family(p)) is not None and not f.composed]
        return (rows, blocks) if blocks else (0, [])

    def prompt_cache(self, key: CacheKey, size: int) -> stages.PromptCache[Any, Any]:
        """The prompt-embedding cache of the components loaded under `key` (one per loaded model)."""
        with self._caches_lock:
            cache = self._prompt_caches.get(key)
            if cache is None or cache.size != size:
                cache = self._prompt_caches[key] = stages.PromptCache(size)
            return cache

    def components(self, spec: t.ModelSpec, task: t.Task) -> dict[str, Any]:
        """The modules `task` of `spec` runs on (loads the model if needed): for tests and debugging."""
        cached = self.cache.get(spec, self._placement(spec))
        try:
            return dict(task_pipelines.pipeline_for_task(cached.pipeline, task, spec).components)
        finally:
            self.cache.release(cached)  # otherwise the entry would count as in use for ever

    def _placement(self, spec: t.ModelSpec) -> Any:
        from omnirt.worker.runtime import backends

        return backends.placement_for(self.start_sync(), spec.runtime)

    async def preload(self, spec: t.ModelSpec) -> None:
        """Load `spec`'s components into the model cache now (and make the modular pipelines of
        its tasks), so its first job finds them warm. A family the mode cannot run is not loaded."""
        await asyncio.to_thread(self._preload_sync, spec)

    def _preload_sync(self, spec: t.ModelSpec) -> None:
        refusal = modular_refusal(spec, spec.pipeline_class)
        if refusal is not None:
            raise ValueError(refusal.error.message)
        cached = self.cache.get(spec, self._placement(spec))
        try:
            family = modular_family(type(cached.pipeline).__name__, cached.pipeline.config)
            refusal = modular_refusal(spec, type(cached.pipeline).__name__, cached.pipeline)
            if family is None or refusal is not None:
                raise ValueError(refusal.error.message if refusal else "no modular family")
            if not family.composed:
                for task in sorted(family.tasks & set(spec.tasks)):
                    self.modular.pipeline(cached, family, task)
        finally:
            self.cache.release(cached)  # otherwise the entry would count as in use for ever

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        return ModularRun(self, assignment, emit, flags).execute()


@dataclasses.dataclass
class _Pass:
    """What one pass through the stages made: images per job, report facts, cache hits per job."""

    images: list[list[Any]]
    info: dict[str, Any]
    hits: dict[str, int]
    # Added to each job's `config_resolved` (the blocks and workflow that ran).
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


class ModularRun(AssignmentRun):
    """One assignment in the modular mode: the shared planning, grouping and loading, then the stages."""

    executor: ModularExecutor

    def _load(self, spec: t.ModelSpec, job_ids: list[str]) -> CachedPipeline | None:
        """Refuse a family the mode cannot run before it loads (and once loaded, for a generic class)."""
        refusal = modular_refusal(spec, spec.pipeline_class)
        if refusal is not None:
            self.fail(job_ids, refusal.error)
            return None
        cached = super()._load(spec, job_ids)
        if cached is not None:
            refusal = modular_refusal(spec, type(cached.pipeline).__name__, cached.pipeline)
            if refusal is not None:
                self.executor.cache.release(cached)
                self.fail(job_ids, refusal.error)
                return None
        return cached

    def run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        """One batch (plans `legacy_call` would put in one pipeline call) in one pass through the stages."""
        family = modular_family(type(cached.pipeline).__name__, cached.pipeline.config)
        assert family is not None  # refused by `_load` otherwise
        group = self.drop_stopped(group, "before start")
        if not group:
            return
        pipeline = None
        if not family.composed and group[0].task in family.workflows:  # a group has one task
            try:
                pipeline = self.executor.modular.pipeline(cached, family, group[0].task)
            except JobFailure as failure:
                self.fail([plan.job_id for plan in group], failure.error)
                return
        kept = []
        for plan in group:
            try:
                self._check(plan, family, pipeline)
                kept.append(plan)
            except JobFailure as failure:
                self.fail([plan.job_id], failure.error)
        if not kept:
            return
        job_ids = [plan.job_id for plan in kept]
        # Loaded adapters count against the model cache budget, as in legacy_call.
        memory = self.executor.cache.memory(cached)
        try:
            # Every plan of a group has the same adapters (they are part of the group key).
            active = self.adapters.get(job_ids[0], [])
            with adapters.applied(cached.pipeline, active, self.spec.runtime, memory=memory):
                if pipeline is None:
                    done = self._stages(cached, kept, active)
                else:
                    done = self._blocks(cached, family, pipeline, kept, active)
            for job_id in job_ids:
                self.call_warnings[job_id] = list(memory.warnings)
        except StopRun:
            for plan in kept:
                reason = self.stop.reason(plan.job_id) or "CANCELLED"
                self.fail([plan.job_id], stop_error(reason, "while running"))
            return
        except JobFailure as failure:
            self.fail(job_ids, failure.error)
            return
        except Exception as exc:
            log.exception("modular run failed")
            self.fail(job_ids, t.JobError("INTERNAL", f"{type(exc).__name__}: {exc}"))
            return
        finished = []
        for plan, images in zip(kept, done.images, strict=True):
            stopped = self.stop.reason(plan.job_id)
            if stopped:  # stopped while the rest of its batch went on: its images are dropped
                self.fail([plan.job_id], stop_error(stopped, "while running"))
            else:
                finished.append((plan, images))
        for plan, artifacts in output_export.export_outputs(finished, self.recorder):
            self._finish(cached, plan, artifacts, done)

    def _finish(
        self, cached: CachedPipeline, plan: ItemPlan, artifacts: list[t.Artifact] | Exception, done: _Pass
    ) -> None:
        job_id = plan.job_id
        try:
            outcome = self.result(plan, artifacts, cached, done.info)
        except Exception as exc:
            log.exception("export failed")
            self.fail([job_id], t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}"))
            return
        if outcome.result is not None and outcome.result.report is not None:
            outcome.result.report.cache_hits = {PROMPT_CACHE: done.hits[job_id]}
            outcome.result.report.config_resolved.update(done.config)
        self.outcomes[job_id] = outcome

    def _check(self, plan: ItemPlan, family: ModularFamily, pipeline: Any) -> None:
        """Refuse what the family's stages or blocks cannot do (the shared planning checked the rest)."""
        if plan.task not in family.tasks:
            raise JobFailure(
                "FAILED_PRECONDITION",
                f"the modular mode runs {', '.join(sorted(t.value for t in family.tasks))} for "
                f"{family.name}, not {plan.task.value}",
                "task",
            )
        if pipeline is None:  # the composed SD stages: media and strength only
            for key in plan.specific:
                if key not in (*MEDIA_ARGUMENTS.values(), "strength"):
                    raise JobFailure(
                        "INVALID_ARGUMENT", f"the modular mode does not take {key!r}", f"extra.{key}"
                    )
            return
        from omnirt.worker.modes.modular import block_run

        accepted = block_run.accepted_arguments(pipeline, family)
        try:
            check_call_arguments(plan, accepted)  # a negative prompt to Flux's blocks, ...
        except JobFailure as failure:
            reason = f"the modular mode's {family.blocks} take no {failure.error.field}; leave it unset"
            raise JobFailure("INVALID_ARGUMENT", reason, failure.error.field) from None
        for key in plan.specific:
            if key not in accepted:
                where = "strength" if key == "strength" else f"extra.{key}"
                reason = f"the modular mode's {family.blocks} ({plan.task.value}) do not take {key!r}"
                raise JobFailure("INVALID_ARGUMENT", reason, where)

    def _previews(self, call: dict[str, Any], first: ItemPlan) -> PreviewMaker | None:
        """The model's `preview` option as a maker for this call's output size, or None (off)."""
        if not call.get("preview"):
            return None
        size = (int(first.common.get("width") or 0), int(first.common.get("height") or 0))
        return PreviewMaker(call["preview"], self.spec.family, *size)

    def _mode_warnings(self, first: ItemPlan, call: dict[str, Any]) -> list[str]:
        """The model's call options this mode does not apply, as report warnings."""
        warnings = []
        if STEP_CACHE in call:
            warnings.append(f"{STEP_CACHE} is not applied in the modular mode (a transformer-model option)")
        if (
            first.job_id in self.options
            and self.options[first.job_id].values.get(inference_mode.NAME) is False
        ):
            warnings.append(
                "inference_mode = false is not applied in the modular mode (its stages take no gradients)"
            )
        return warnings

    def _blocks(
        self,
        cached: CachedPipeline,
        family: ModularFamily,
        pipeline: Any,
        group: list[ItemPlan],
        active: Sequence[adapters.ResolvedAdapter],
    ) -> _Pass:
        """A batch through the family's diffusers blocks (`block_run`), stage by stage."""
        from omnirt.worker.modes.modular import block_run

        first = group[0]
        legacy = task_pipelines.pipeline_for_task(cached.pipeline, first.task, self.spec)
        call = self.options[first.job_id].call() if first.job_id in self.options else {}
        warnings = self._mode_warnings(first, call)
        facts: dict[str, Any] = {}

        def setup(view: Any) -> None:  # each call's own scheduler and VAE flags
            view.scheduler, notes = fresh_scheduler(pipeline.scheduler, first.scheduler)
            seed_noise_sampler(view.scheduler, [seed for plan in group for seed in plan.seeds])
            applied, vae_notes = runtime_options.call_vae(view, call)
            if not facts:
                facts.update(scheduler=type(view.scheduler).__name__, options=applied)
                warnings.extend([*notes, *vae_notes])

        engine = self.executor.steps if step_engine.eligible(legacy) and not active else None
        job_ids = [plan.job_id for plan in group]
        with contextlib.ExitStack() as stack:
            member = None
            if engine is not None:  # the denoiser's steps shared with concurrent calls
                note = functools.partial(self.recorder.note, job_ids)
                member = stack.enter_context(
                    engine.member(job_ids, max(p.item.request.priority for p in group), note)
                )

            def view_setup(view: Any) -> None:
                setup(view)
                if engine is not None and member is not None:
                    engine.share(view, member)

            def after_step(step: int, total: int) -> None:
                if engine is not None and member is not None and step >= total:
                    engine.leave(member)  # decode while the others take their next step

            runner = block_run.BlocksGroup(
                pipeline,
                family,
                legacy,
                recorder=self.recorder,
                stop=self.stop,
                device=self.placement.device,
                cache=self.executor.prompt_cache(cached.key, prompt_cache_size(self.spec)),
                encoder_variant=encoder_adapters(pipeline, active),
                view_setup=view_setup,
                previews=self._previews(call, first),
                after_step=after_step,
            )
            made = runner.run(group)
        images = []
        for plan in group:
            outputs = made.images.get(plan.job_id) or []
            images.append(task_pipelines.finish_outputs(plan.task, outputs, plan.specific, self.spec.runtime))
        info = {
            "scheduler": facts.get("scheduler", type(pipeline.scheduler).__name__),
            "num_inference_steps": made.steps,
            "warnings": warnings,
            "pipeline_class": type(pipeline).__name__,
            "runtime_options": {
                **facts.get("options", {}),
                **({"preview": call["preview"]} if call.get("preview") else {}),
            },
        }
        if member is not None:
            info["step_engine"] = {"used": True, **member.report()}
        elif self.executor.steps is not None and step_engine.eligible(legacy):
            info["step_engine"] = {
                "used": False,
                "reason": "in the modular mode a call with LoRA adapters shares no steps",
            }
        config = {"modular_blocks": family.blocks, "workflow": family.workflows[first.task] or "all"}
        return _Pass(images, info, made.hits, config)

    def _encode(
        self,
        view: Any,
        group: list[ItemPlan],
        guided: bool,
        variant: stages.EncoderAdapters,
        cache_key: CacheKey,
    ) -> tuple[Any, dict[str, int]]:
        """`encoder_hidden_states` of the batch and each job's cache hit (1: the encoder did not run for it).

        Each distinct prompt is encoded alone, so its embeddings are the same bits whatever batch
        it came in (a cache hit then gives exactly the image a miss gives).
        """
        cache = self.executor.prompt_cache(cache_key, prompt_cache_size(self.spec))
        seen: dict[stages.PromptKey, stages.Embeds] = {}
        rows, hits = [], {}
        for plan in group:
            req = plan.item.request
            key: stages.PromptKey = (req.prompt, req.negative_prompt, guided, variant)
            embeds = seen.get(key)
            if embeds is None:
                embeds = cache.get(key)
            hits[plan.job_id] = 0 if embeds is None else 1
            if embeds is None:
                embeds = stages.encode(view, key, self.placement.device)
                cache.put(key, embeds)
            seen[key] = embeds
            rows.append((embeds, plan.num_outputs))
        return stages.batch_embeds(rows), hits

    def _stages(
        self, cached: CachedPipeline, group: list[ItemPlan], active: Sequence[adapters.ResolvedAdapter]
    ) -> _Pass:
        """encode -> prepare + denoise -> decode for a batch of compatible plans (adapters active)."""
        import torch

        first = group[0]
        job_ids = [plan.job_id for plan in group]
        base = task_pipelines.pipeline_for_task(cached.pipeline, first.task, self.spec)
        # A shallow copy with its own scheduler (per-call state); the modules stay shared.
        view = copy.copy(base)
        view.scheduler, warnings = fresh_scheduler(base.scheduler, first.scheduler)
        seed_noise_sampler(view.scheduler, [seed for plan in group for seed in plan.seeds])
        # The model's call options: VAE slicing/tiling on a VAE of the view's own (legacy_call's way).
        call = self.options[first.job_id].call() if first.job_id in self.options else {}
        call_options, notes = runtime_options.call_vae(view, call)
        warnings += notes + self._mode_warnings(first, call)
        device = self.placement.device
        args = {**first.common, **first.specific}
        guidance = float(args.get("guidance_scale", 7.5))
        guided = guidance > 1.0 and view.unet.config.time_cond_proj_dim is None

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "encode")
        with own_tokenizers(view):  # another call may encode on this pipeline at the same time
            hidden, hits = self._encode(view, group, guided, encoder_adapters(view, active), cached.key)
        self.recorder.stage_finished(job_ids, "encode", started)

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "denoise")
        # One generator per output, in job order: each output's noise is its seed's, batched or not.
        generators = [torch.Generator(device).manual_seed(seed) for plan in group for seed in plan.seeds]
        count = len(generators)
        prepared = stages.prepare(view, first.task, args, count, hidden.dtype, device, generators)
        total_steps = len(prepared.timesteps)

        previews = self._previews(call, first)
        firsts = first_outputs([plan.num_outputs for plan in group])

        def on_step(step: int, total: int, latents: Any) -> None:
            self.recorder.progress(job_ids, step, total)
            if self.stop.all_stopped(job_ids):
                raise StopRun()
            if previews is not None and previews.due(step, total):
                send_previews(self.recorder, self.stop, previews, view, latents, step, total, job_ids, firsts)

        latents = stages.denoise(view, prepared, hidden, guidance, on_step)
        self.recorder.stage_finished(job_ids, "denoise", started)

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "decode")
        images = stages.decode(view, latents, generators)
        images = task_pipelines.finish_outputs(first.task, images, first.specific, self.spec.runtime)
        self.recorder.stage_finished(job_ids, "decode", started)
        if len(images) != count:
            raise JobFailure("INTERNAL", f"the stages made {len(images)} images, expected {count}")
        per_job, at = [], 0
        for plan in group:
            per_job.append(images[at : at + plan.num_outputs])
            at += plan.num_outputs
        info = {
            "scheduler": type(view.scheduler).__name__,
            "num_inference_steps": total_steps,
            "warnings": warnings,
            "pipeline_class": type(base).__name__,
            "runtime_options": {**call_options, **({"preview": call["preview"]} if previews else {})},
        }
        return _Pass(per_job, info, hits)
