"""`ModularExecutor`: the `modular` execution mode, a model run stage by stage from shared components.

A family's components (UNet, VAE, text encoder, tokenizer, scheduler) are loaded once per
worker by the model cache (keyed by source, so every catalog entry on `builtin:tiny-sd` shares
them) and every task uses them: image2image and inpaint pipelines are `from_pipe` views of the
loaded one, the same module objects. Each job then runs `encode` (text encoder, skipped on a
prompt-embedding cache hit), `denoise` (one PROGRESS event, one stop check per step), `decode`
(VAE) and `export`, each a STAGE event pair and a `RunReport.timings` entry. The stages are
composed in `modular_stages` (diffusers 0.42 has no modular pipeline for SD 1.x).

Runtime options (`ModelSpec.runtime`): `prompt_cache_size` (default 256; 0 = no cache).
Loading, planning, media decoding, export and the RunReport are `legacy_call`'s; jobs of one
assignment run one after the other (no cross-job batching in this mode).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from typing import Any

from omnirt import types as t
from omnirt.worker import modular_stages as stages
from omnirt.worker import task_pipelines
from omnirt.worker.config import WorkerConfig
from omnirt.worker.executor import CancelFlags, EventSink, JobFailure, StopRun, stop_error
from omnirt.worker.legacy_call import LegacyCallExecutor, _AssignmentRun, _fresh_scheduler
from omnirt.worker.model_cache import CachedPipeline, CacheKey, ModelCache
from omnirt.worker.pipeline_args import MEDIA_ARGUMENTS, ItemPlan
from omnirt.worker.protocol import Assignment, ItemOutcome

log = logging.getLogger(__name__)

MODE = "modular"
DEFAULT_PROMPT_CACHE_SIZE = 256
PROMPT_CACHE = "prompt_embeds"
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
        from omnirt.worker import backends

        return backends.placement_for(self._start_sync(), spec.runtime)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        from omnirt.worker import null_model

        if null_model.is_null_model(assignment.model):
            return super().run_sync(assignment, emit, flags)
        return _ModularRun(self, assignment, emit, flags).execute()


class _ModularRun(_AssignmentRun):
    """One assignment in the modular mode: legacy_call's planning and loading, then the stages."""

    executor: ModularExecutor

    def _run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        for plan in self.drop_stopped(group, "before start"):
            self._run_plan(cached, plan)

    def _run_plan(self, cached: CachedPipeline, plan: ItemPlan) -> None:
        job_id = plan.job_id
        try:
            images, info, hits = self._stages(cached, plan)
        except StopRun:
            self.fail([job_id], stop_error(self.stop.reason(job_id) or "CANCELLED", "while running"))
            return
        except JobFailure as failure:
            self.fail([job_id], failure.error)
            return
        except Exception as exc:
            log.exception("modular run failed")
            self.fail([job_id], t.JobError("INTERNAL", f"{type(exc).__name__}: {exc}"))
            return
        reason = self.stop.reason(job_id)
        if reason:
            self.fail([job_id], stop_error(reason, "while running"))
            return
        try:
            outcome = self._result(plan, images, cached, info)
        except Exception as exc:
            log.exception("export failed")
            self.fail([job_id], t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}"))
            return
        if outcome.result is not None and outcome.result.report is not None:
            report = dataclasses.replace(outcome.result.report, execution_mode=MODE, cache_hits=hits)
            outcome.result.report = report
        self.outcomes[job_id] = outcome

    def _check(self, plan: ItemPlan) -> None:
        if plan.task not in TASKS:
            raise JobFailure(
                "FAILED_PRECONDITION",
                f"the modular mode runs {', '.join(sorted(t.value for t in TASKS))}, not {plan.task.value}",
                "task",
            )
        if getattr(plan.item.request, "adapters", None):
            raise JobFailure("INVALID_ARGUMENT", "the modular mode does not apply adapters yet", "adapters")
        for key in plan.specific:
            if key not in (*MEDIA_ARGUMENTS.values(), "strength"):
                raise JobFailure(
                    "INVALID_ARGUMENT", f"the modular mode does not take {key!r}", f"extra.{key}"
                )

    def _stages(
        self, cached: CachedPipeline, plan: ItemPlan
    ) -> tuple[list[Any], dict[str, Any], dict[str, int]]:
        """encode -> prepare + denoise -> decode for one job; (images, report facts, cache hits)."""
        import torch

        self._check(plan)
        job_ids = [plan.job_id]
        req = plan.item.request
        base = task_pipelines.pipeline_for_task(cached.pipeline, plan.task, self.spec)
        # A shallow copy with its own scheduler (per-call state); the modules stay shared.
        view = copy.copy(base)
        view.scheduler, warnings = _fresh_scheduler(base.scheduler, plan.scheduler)
        device = self.placement.device
        args = {**plan.common, **plan.specific}
        guidance = float(args.get("guidance_scale", 7.5))
        guided = guidance > 1.0 and view.unet.config.time_cond_proj_dim is None

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "encode")
        key: stages.PromptKey = (req.prompt, req.negative_prompt, guided)
        prompts = self.executor.prompt_cache(cached.key, prompt_cache_size(self.spec))
        embeds = prompts.get(key)
        hit = embeds is not None
        if embeds is None:
            embeds = stages.encode(view, key, device)
            prompts.put(key, embeds)
        self.recorder.stage_finished(job_ids, "encode", started)

        started = time.perf_counter()
        self.recorder.stage_started(job_ids, "denoise")
        generators = [torch.Generator(device).manual_seed(seed) for seed in plan.seeds]
        hidden = stages.repeat_embeds(embeds, plan.num_outputs)
        prepared = stages.prepare(view, plan.task, args, plan.num_outputs, hidden.dtype, device, generators)
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
        images = task_pipelines.finish_outputs(plan.task, images, plan.specific, self.spec.runtime)
        self.recorder.stage_finished(job_ids, "decode", started)
        info = {
            "scheduler": type(view.scheduler).__name__,
            "num_inference_steps": total_steps,
            "warnings": warnings,
            "pipeline_class": type(base).__name__,
        }
        return images, info, {PROMPT_CACHE: 1 if hit else 0}
