"""`ModularExecutor`: the `modular` execution mode, a model run stage by stage from shared components.

A family's components (UNet, VAE, text encoder, tokenizer, scheduler) are loaded once per
worker by the model cache (keyed by source, so every catalog entry on `builtin:tiny-sd` shares
them) and every task uses them: image2image and inpaint pipelines are `from_pipe` views of the
loaded one, the same module objects. The stages are composed in `modular_stages` (diffusers
0.42 has no modular pipeline for SD 1.x): `encode` (text encoder, skipped on a prompt-embedding
cache hit), `denoise` (one PROGRESS event, one stop check per step), `decode` (VAE) and
`export`, each a STAGE event pair and a `RunReport.timings` entry.

Batches: the jobs of an assignment are grouped like `legacy_call` groups them (same task, size,
steps, guidance, scheduler, extras and adapters; media inputs never batch) and each group runs
as ONE pass through the stages: every prompt is encoded (or found in the cache) on its own,
then one denoising loop runs over the concatenated latents (one generator per output, so each
job's noise is what it would be alone) and one VAE decode. A cancelled job's result is dropped;
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
import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt.worker.config import WorkerConfig
from omnirt.worker.export import outputs as output_export
from omnirt.worker.modes import null as null_model
from omnirt.worker.modes.assignment import AssignmentRun
from omnirt.worker.modes.base import CancelFlags, EventSink, JobFailure, StopRun, stop_error
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular import stages
from omnirt.worker.modes.schedulers import fresh_scheduler
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import MEDIA_ARGUMENTS, ItemPlan
from omnirt.worker.pipelines.model_cache import CachedPipeline, CacheKey, ModelCache
from omnirt.worker.protocol import Assignment, ItemOutcome
from omnirt.worker.runtime import adapters, inference_mode
from omnirt.worker.runtime import options as runtime_options

log = logging.getLogger(__name__)

MODE = ExecutionMode.MODULAR
DEFAULT_PROMPT_CACHE_SIZE = 256
PROMPT_CACHE = "prompt_embeds"
STEP_CACHE = "step_cache"  # diffusers cache hooks: legacy_call only
# Tasks the composed stages run (Stable Diffusion 1.x/2.x image tasks).
TASKS = frozenset({t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT})


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
    """The active adapters that change `view`'s text encoder (loaded ones only), as a cache-key part."""
    on_encoder = getattr(view.text_encoder, "peft_config", None) or {}
    return tuple((str(a.path), a.scale) for a in active if a.adapter_name in on_encoder)


class ModularExecutor(LegacyCallExecutor):
    """Runs assignments stage by stage on components shared by all tasks of a model family."""

    mode = MODE

    def __init__(self, config: WorkerConfig, cache: ModelCache | None = None) -> None:
        super().__init__(config, cache)
        self._caches_lock = threading.Lock()
        self._prompt_caches: dict[CacheKey, stages.PromptCache] = {}

    def prompt_cache(self, key: CacheKey, size: int) -> stages.PromptCache:
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
        """Load `spec`'s components into the model cache now, so its first job finds them warm."""
        if not null_model.is_null_model(spec):
            await asyncio.to_thread(self.components, spec, t.Task.TEXT2IMAGE)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        if null_model.is_null_model(assignment.model):
            return super().run_sync(assignment, emit, flags)
        return ModularRun(self, assignment, emit, flags).execute()


@dataclasses.dataclass
class _Pass:
    """What one pass through the stages made: images per job, report facts, cache hits per job."""

    images: list[list[Any]]
    info: dict[str, Any]
    hits: dict[str, int]


class ModularRun(AssignmentRun):
    """One assignment in the modular mode: the shared planning, grouping and loading, then the stages."""

    executor: ModularExecutor

    def run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        """One batch (plans `legacy_call` would put in one pipeline call) in one pass through the stages."""
        kept = []
        for plan in self.drop_stopped(group, "before start"):
            try:
                self._check(plan)
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
                done = self._stages(cached, kept, active)
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
        self.outcomes[job_id] = outcome

    def _check(self, plan: ItemPlan) -> None:
        if plan.task not in TASKS:
            raise JobFailure(
                "FAILED_PRECONDITION",
                f"the modular mode runs {', '.join(sorted(t.value for t in TASKS))}, not {plan.task.value}",
                "task",
            )
        for key in plan.specific:
            if key not in (*MEDIA_ARGUMENTS.values(), "strength"):
                raise JobFailure(
                    "INVALID_ARGUMENT", f"the modular mode does not take {key!r}", f"extra.{key}"
                )

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
        # The model's call options: VAE slicing/tiling on a VAE of the view's own (legacy_call's way).
        call = self.options[first.job_id].call() if first.job_id in self.options else {}
        call_options, notes = runtime_options.call_vae(view, call)
        warnings += notes
        if STEP_CACHE in call:
            warnings.append(f"{STEP_CACHE} is not applied in the modular mode (a transformer-model option)")
        if (
            first.job_id in self.options
            and self.options[first.job_id].values.get(inference_mode.NAME) is False
        ):
            warnings.append(
                "inference_mode = false is not applied in the modular mode (its stages take no gradients)"
            )
        device = self.placement.device
        args = {**first.common, **first.specific}
        guidance = float(args.get("guidance_scale", 7.5))
        guided = guidance > 1.0 and view.unet.config.time_cond_proj_dim is None

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "encode")
        hidden, hits = self._encode(view, group, guided, encoder_adapters(view, active), cached.key)
        self.recorder.stage_finished(job_ids, "encode", started)

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "denoise")
        # One generator per output, in job order: each output's noise is its seed's, batched or not.
        generators = [torch.Generator(device).manual_seed(seed) for plan in group for seed in plan.seeds]
        count = len(generators)
        prepared = stages.prepare(view, first.task, args, count, hidden.dtype, device, generators)
        total_steps = len(prepared.timesteps)

        def on_step(step: int, total: int) -> None:
            self.recorder.progress(job_ids, step, total)
            if self.stop.all_stopped(job_ids):
                raise StopRun()

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
            "runtime_options": call_options,
        }
        return _Pass(per_job, info, hits)
