"""`LegacyCallExecutor`: the `legacy_call` execution mode, a diffusers pipeline called as is.

One assignment = one model; its items are grouped by compatible settings and each group is
one pipeline call (prompts as a list, one generator per output), so a batch from the
controller's batcher runs as a single call. The blocking call runs in a thread; progress,
cancellation and deadlines go through `callback_on_step_end`.

Stage timings: `load` is the model cache load (absent when warm); `denoise` runs from the
call's start (text encoding included) to the last step callback; `decode` from the last step
callback to the call's return (the pipeline decodes internally); `export` is the encoding of
the call's outputs (`output_export`: a batch's encode at once, and its jobs' results leave together).

Models of the `null` family (no compute, for control-plane tests and benchmarks) are run by
`omnirt.worker.modes.null` instead, on the event loop, without the model cache.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import threading
import time
import weakref
from typing import Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt.worker import redact
from omnirt.worker.config import WorkerConfig
from omnirt.worker.export import outputs as output_export
from omnirt.worker.modes import null as null_model
from omnirt.worker.modes.base import (
    CancelFlags,
    EventSink,
    Executor,
    JobFailure,
    StopCheck,
    StopRun,
    stop_error,
)
from omnirt.worker.modes.events import RunRecorder, StepMonitor
from omnirt.worker.modes.report import run_report
from omnirt.worker.modes.thread_events import ThreadEvents
from omnirt.worker.pipelines import media_inputs, model_cache
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import (
    ItemPlan,
    call_parameters,
    check_arguments,
    pipeline_kwargs,
    plan_item,
    resolved_config,
    scheduler_class,
)
from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache, ModelLoadError
from omnirt.worker.protocol import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker.runtime import adapters, backends, inference_mode, quantization, step_cache
from omnirt.worker.runtime import options as runtime_options
from omnirt.worker.runtime.memory import PeakMemory

log = logging.getLogger(__name__)

MODE = ExecutionMode.LEGACY_CALL


def _quiet_libraries() -> None:
    """Route diffusers/transformers logs through ours (their default handlers print unformatted)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    for lib in (diffusers_logging, transformers_logging):
        lib.disable_default_handler()
        lib.enable_propagation()
        lib.disable_progress_bar()
    quantization.quiet_import_logs()


def _without_runtime(item: AssignmentItem) -> AssignmentItem:
    """`item` without `extra["runtime"]` (runtime options, not a pipeline argument)."""
    extra = item.request.extra
    if runtime_options.REQUEST_KEY not in extra:
        return item
    rest = {k: v for k, v in extra.items() if k != runtime_options.REQUEST_KEY}
    return dataclasses.replace(item, request=dataclasses.replace(item.request, extra=rest))


# The pipeline's scheduler -> its pristine schedulers by class (dropped with the pipeline).
_SCHEDULER_TEMPLATES: weakref.WeakKeyDictionary[Any, dict[type, Any]] = weakref.WeakKeyDictionary()


def _fresh_scheduler(base: Any, name: str) -> tuple[Any, list[str]]:
    """A new scheduler from the pipeline's config: of class `name` when given, else the same class."""
    cls = scheduler_class(name) if name else type(base)
    warnings = []
    if cls is not type(base):  # `compatibles` imports each class it names: only when it matters
        compatibles = {c.__name__ for c in getattr(base, "compatibles", [])}
        if compatibles and cls.__name__ not in compatibles:
            warnings.append(f"scheduler {cls.__name__} is not listed as compatible with this pipeline")
    templates = _SCHEDULER_TEMPLATES.setdefault(base, {})
    template = templates.get(cls)
    if template is None:
        template = templates[cls] = cls.from_config(base.config)
    return _scheduler_copy(template), warnings


def _scheduler_copy(template: Any) -> Any:
    """A copy of a pristine scheduler that shares nothing a call changes, in a sixth of deepcopy's time.

    Its tensors and arrays are cloned and its lists, dicts and sets deep-copied (DPM-Solver keeps
    its model outputs in a list it fills in place); the frozen config and scalars are shared.
    """
    import numpy as np
    import torch
    from diffusers.configuration_utils import FrozenDict

    scheduler = copy.copy(template)
    state = scheduler.__dict__
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            state[name] = value.clone()
        elif isinstance(value, np.ndarray):
            state[name] = value.copy()
        elif isinstance(value, list | dict | set) and not isinstance(value, FrozenDict):
            state[name] = copy.deepcopy(value)
    return scheduler


def _prompt_kwargs(group: list[ItemPlan]) -> dict[str, Any]:
    """Prompt arguments of one call: one job as is; a batch as one prompt per output."""
    if len(group) == 1:
        request = group[0].item.request
        kwargs: dict[str, Any] = {"prompt": request.prompt, "num_images_per_prompt": group[0].num_outputs}
        if request.negative_prompt:
            kwargs["negative_prompt"] = request.negative_prompt
        return kwargs
    # Repeating each job's prompt per output keeps outputs (and seeds) in job order, whatever
    # number of outputs each job asks for.
    kwargs = {"prompt": [p.item.request.prompt for p in group for _ in range(p.num_outputs)]}
    if any(p.item.request.negative_prompt for p in group):
        kwargs["negative_prompt"] = [
            p.item.request.negative_prompt for p in group for _ in range(p.num_outputs)
        ]
    kwargs["num_images_per_prompt"] = 1
    return kwargs


class LegacyCallExecutor(Executor):
    """Runs assignments by calling the model's diffusers pipeline."""

    mode = MODE

    def __init__(self, config: WorkerConfig, cache: ModelCache | None = None) -> None:
        self.config = config
        self.cache = cache or ModelCache(config.model_dir, config.model_cache_bytes)
        self.inputs = media_inputs.InputPolicy.of(config)
        self._backend = ""
        self._start_lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self._backend or self.config.backend

    def _start_sync(self) -> str:
        with self._start_lock:
            if not self._backend:
                import diffusers  # noqa: F401  (the first import takes seconds: pay it before any job)

                _quiet_libraries()
                backend = backends.detect_backend(self.config.backend)
                backends.configure_threads(self.config.torch_threads)
                self._backend = backend
            return self._backend

    async def start(self) -> None:
        await asyncio.to_thread(self._start_sync)

    def loaded_models(self) -> list[str]:
        return self.cache.loaded_models()

    async def preload(self, spec: t.ModelSpec) -> None:
        """Load `spec` into the model cache now (`--preload`), so its first job finds it warm."""
        if null_model.is_null_model(spec):
            return

        def load() -> None:
            placement = backends.placement_for(self._start_sync(), spec.runtime)
            self.cache.release(self.cache.get(spec, placement))

        await asyncio.to_thread(load)

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        if null_model.is_null_model(assignment.model):
            # No compute, so no thread: it runs on the loop and never reaches the model cache.
            return await null_model.run_null(
                assignment, emit, flags, worker_id=self.config.worker_id, backend=self.backend
            )
        events = ThreadEvents(asyncio.get_running_loop(), emit, self.config.progress_interval_ms / 1000)
        return await events.run(self.run_sync, assignment, events, flags)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        if null_model.is_null_model(assignment.model):
            return null_model.run_null_sync(
                assignment, emit, flags, worker_id=self.config.worker_id, backend=self.backend
            )
        return _AssignmentRun(self, assignment, emit, flags).execute()


class _AssignmentRun:
    """The state of one assignment while it runs."""

    def __init__(
        self, executor: LegacyCallExecutor, assignment: Assignment, emit: EventSink, flags: CancelFlags
    ):
        self.executor = executor
        self.assignment = assignment
        self.spec = assignment.model
        self.recorder = RunRecorder(emit)
        self.stop = StopCheck(flags, assignment)
        self.outcomes: dict[str, ItemOutcome] = {}
        self.cold = False
        self.cache_warnings: list[str] = []
        self.adapters: dict[str, list[adapters.ResolvedAdapter]] = {}
        # Runtime options per job (the model's, overridden by the request's).
        self.options: dict[str, runtime_options.Effective] = {}
        # Warnings of a job's pipeline call (adapters unloaded or models evicted to fit the budget).
        self.call_warnings: dict[str, list[str]] = {}
        self.placement = backends.Placement("cpu", "cpu", "float32")
        self.memory = PeakMemory("cpu")

    # ---- outcomes ------------------------------------------------------------------------

    def fail(self, job_ids: list[str], error: t.JobError) -> None:
        # Every error of this mode (and modular's) leaves through here: none shows a worker path.
        known = {self.executor.config.model_dir: "MODEL_DIR"}
        error = redact.public_error(error, known, keep=[self.spec.source])
        for job_id in job_ids:
            self.outcomes.setdefault(job_id, ItemOutcome(job_id, error=error))

    def drop_stopped(self, plans: list[ItemPlan], where: str) -> list[ItemPlan]:
        """Fail the plans whose job must stop; return the others."""
        kept = []
        for plan in plans:
            reason = self.stop.reason(plan.job_id)
            if reason:
                self.fail([plan.job_id], stop_error(reason, where))
            else:
                kept.append(plan)
        return kept

    # ---- the run -------------------------------------------------------------------------

    def execute(self) -> list[ItemOutcome]:
        items = self.assignment.items
        worker_id = self.executor.config.worker_id
        for item in items:
            self.recorder.running(item.job_id, worker_id, item.attempt)
        try:
            self._execute()
        except Exception as exc:  # a bug here must cost the jobs, never the worker
            log.exception("assignment %s failed", self.assignment.assignment_id)
            self.fail([i.job_id for i in items], t.JobError("INTERNAL", f"{type(exc).__name__}: {exc}"))
        return [self.outcomes[item.job_id] for item in items]

    def _execute(self) -> None:
        job_ids = self.assignment.job_ids
        try:
            backend = self.executor._start_sync()
            self.placement = backends.placement_for(backend, self.spec.runtime)
            runtime_options.model_options(self.spec.runtime)
        except backends.BackendError as exc:
            self.fail(job_ids, t.JobError("FAILED_PRECONDITION", str(exc)))
            return
        self.memory = PeakMemory(self.placement.device)
        self.memory.reset()
        plans = []
        for item in self.assignment.items:
            try:
                if self.executor.mode != MODE and runtime_options.REQUEST_KEY in item.request.extra:
                    where = runtime_options.REQUEST_PREFIX
                    reason = f"{where}: the {self.executor.mode} mode takes no runtime options per request"
                    raise JobFailure("INVALID_ARGUMENT", reason, where)
                options = runtime_options.for_request(self.spec.runtime, item.request.extra)
                runtime_options.check_load(options, self.placement)
                plans.append(plan_item(_without_runtime(item), self.spec))
                self.options[item.job_id] = options
            except JobFailure as failure:
                self.fail([item.job_id], failure.error)
        plans = self.drop_stopped(plans, "before start")
        # One model cache entry per set of load options (a batch from the controller has one).
        parts: dict[str, list[ItemPlan]] = {}
        for plan in plans:
            parts.setdefault(self.options[plan.job_id].load().key(), []).append(plan)
        for part in parts.values():
            runtime = self.options[part[0].job_id].runtime_for_load(self.spec.runtime)
            cached = self._load(dataclasses.replace(self.spec, runtime=runtime), [p.job_id for p in part])
            if cached is None:
                continue
            try:
                self._run_plans(cached, part)
            finally:
                self.executor.cache.release(cached)

    def _run_plans(self, cached: CachedPipeline, plans: list[ItemPlan]) -> None:
        groups: dict[tuple[str, str], list[ItemPlan]] = {}
        inputs = self.executor.inputs.for_model(self.spec)
        for plan in plans:
            try:
                # image2image / inpaint on a text-to-image model: a pipeline sharing its modules.
                pipeline = task_pipelines.pipeline_for_task(cached.pipeline, plan.task, self.spec)
                task_pipelines.check_size(pipeline, plan.common)
                pipeline_kwargs(plan, call_parameters(pipeline), inputs)
                check_arguments(pipeline, plan)
                request = plan.item.request
                model_dir = self.executor.config.model_dir
                self.adapters[plan.job_id] = adapters.resolve(request.adapters, self.spec.runtime, model_dir)
                step_cache.check(pipeline, self.options[plan.job_id])
                runtime_options.check_adapters(self.options[plan.job_id], len(self.adapters[plan.job_id]))
            except JobFailure as failure:
                self.fail([plan.job_id], failure.error)
                continue
            # Different adapters (part of the plan's key) or runtime options never share a call,
            # even within one assignment.
            key = (plan.group_key(), self.options[plan.job_id].group_key())
            groups.setdefault(key, []).append(plan)
        for group in groups.values():
            self._run_group(cached, group)

    def _load(self, spec: t.ModelSpec, job_ids: list[str]) -> CachedPipeline | None:
        load_start: list[float] = []

        def on_load_start() -> None:
            load_start.append(time.perf_counter())
            self.recorder.stage_started(job_ids, "load")

        try:
            cached = self.executor.cache.get(spec, self.placement, on_load_start)
        except ModelLoadError as exc:
            log.warning("%s", exc)
            self.fail(job_ids, t.JobError("FAILED_PRECONDITION", str(exc)))
            return None
        if cached.cold and load_start:
            start = load_start[0]
            self.recorder.stage_finished(job_ids, "load", start, start + cached.load_ms / 1000.0)
        self.cold = cached.cold
        self.cache_warnings = model_cache.cache_warnings(cached)
        return cached

    # ---- one pipeline call ---------------------------------------------------------------

    def _run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        group = self.drop_stopped(group, "before start")
        if not group:
            return
        job_ids = [p.job_id for p in group]
        options = self.options[job_ids[0]]
        memory = self.executor.cache.memory(cached)
        # A step cache hooks the shared denoiser for the call: no other call may run meanwhile.
        exclusive = step_cache.NAME in options.call()
        try:
            pipeline = task_pipelines.pipeline_for_task(cached.pipeline, group[0].task, self.spec)
            with adapters.applied(
                cached.pipeline,
                self.adapters.get(job_ids[0], []),
                self.spec.runtime,
                exclusive=exclusive,
                memory=memory,
            ):
                try:
                    images, call_info = self._call(pipeline, group, options)
                except (StopRun, JobFailure):
                    raise
                except Exception as exc:
                    if not runtime_options.is_compiled(cached.pipeline):
                        raise
                    runtime_options.drop_compile(cached.pipeline, exc)  # and run once more, eagerly
                    images, call_info = self._call(pipeline, group, options)
            for job_id in job_ids:
                self.call_warnings[job_id] = list(memory.warnings)
        except StopRun:
            for plan in group:
                self.fail(
                    [plan.job_id], stop_error(self.stop.reason(plan.job_id) or "CANCELLED", "while running")
                )
            return
        except JobFailure as failure:
            self.fail(job_ids, failure.error)
            return
        except Exception as exc:
            log.exception("pipeline call failed")
            self.fail(job_ids, t.JobError("INTERNAL", f"{type(exc).__name__}: {exc}"))
            return
        done = []
        for plan, plan_images in zip(group, images, strict=True):
            reason = self.stop.reason(plan.job_id)
            if reason:  # stopped while the rest of its batch went on
                self.fail([plan.job_id], stop_error(reason, "while running"))
            else:
                done.append((plan, plan_images))
        for plan, artifacts in output_export.export_outputs(done, self.recorder):
            try:
                self.outcomes[plan.job_id] = self._result(plan, artifacts, cached, call_info)
            except Exception as exc:
                log.exception("export failed")
                self.fail(
                    [plan.job_id], t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}")
                )

    def _call(
        self, pipeline: Any, group: list[ItemPlan], options: runtime_options.Effective
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        """One pipeline call for `group`; returns each plan's images and facts for the report."""
        import torch

        first = group[0]
        job_ids = [p.job_id for p in group]
        # A shallow copy with its own scheduler: schedulers keep per-call state, and several
        # slots may run the same cached pipeline at once. The weights stay shared.
        view = copy.copy(pipeline)
        scheduler, warnings = _fresh_scheduler(pipeline.scheduler, first.scheduler)
        if type(scheduler) is type(pipeline.scheduler):
            # The config already names this class: skip diffusers' __setattr__ rewriting it.
            object.__setattr__(view, "scheduler", scheduler)
        else:
            view.scheduler = scheduler
        call_options, notes = runtime_options.call_vae(view, options.call())
        warnings += notes
        accepted = call_parameters(view)
        generic = {**first.common, **first.specific, **_prompt_kwargs(group)}
        kwargs = task_pipelines.adapt_kwargs(generic, accepted)
        device = self.placement.device
        kwargs["generator"] = [torch.Generator(device).manual_seed(seed) for p in group for seed in p.seeds]
        monitor = StepMonitor(
            self.recorder, self.stop, job_ids, int(first.common.get("num_inference_steps", 0))
        )
        if "callback_on_step_end" in accepted:
            kwargs["callback_on_step_end"] = monitor

        # Reported when it is not the default: set by the catalog or request, or off for this pipeline.
        setting = options.values.get(inference_mode.NAME)
        in_inference_mode = inference_mode.use_inference_mode(view, setting)
        if setting is not None or not in_inference_mode:
            call_options[inference_mode.NAME] = in_inference_mode
        with inference_mode.call_context(in_inference_mode), step_cache.enabled(view, options) as usage:
            monitor.start()
            output = view(**kwargs)
            monitor.finish()
        cache_hits = {}
        if usage is not None:
            call_options[step_cache.NAME] = options.call()[step_cache.NAME]
            cache_hits[step_cache.NAME] = usage.reused

        images = task_pipelines.call_outputs(output)  # images, or one frame array per video
        images = task_pipelines.finish_outputs(first.task, images, first.specific, self.spec.runtime)
        expected = sum(p.num_outputs for p in group)
        if len(images) != expected:
            raise JobFailure("INTERNAL", f"the pipeline returned {len(images)} images, expected {expected}")
        split, at = [], 0
        for plan in group:
            split.append(images[at : at + plan.num_outputs])
            at += plan.num_outputs
        info = {
            "scheduler": type(view.scheduler).__name__,
            "num_inference_steps": monitor.total_steps or first.common.get("num_inference_steps"),
            "warnings": warnings,
            "pipeline_class": type(pipeline).__name__,
            "runtime_options": call_options,
            "cache_hits": cache_hits,
        }
        return split, info

    # ---- results -------------------------------------------------------------------------

    def _result(
        self,
        plan: ItemPlan,
        artifacts: list[t.Artifact] | Exception,
        cached: CachedPipeline,
        info: dict[str, Any],
    ) -> ItemOutcome:
        """The job's result from its exported artifacts (raises the exception its export raised)."""
        if isinstance(artifacts, Exception):
            raise artifacts
        job_id = plan.job_id
        pipeline_class = info.get("pipeline_class") or type(cached.pipeline).__name__
        first = artifacts[0]
        config = resolved_config(
            plan,
            {
                "width": first.width,
                "height": first.height,
                "num_inference_steps": info["num_inference_steps"],
                "scheduler": info["scheduler"],
                "dtype": self.placement.dtype,
                "device": self.placement.device,
                "pipeline_class": pipeline_class,
                "source": cached.key.source,
            },
        )
        if self.adapters.get(job_id):
            config["adapters"] = [
                {**a.report(), "bytes": adapters.adapter_bytes(cached.pipeline, a)}
                for a in self.adapters[job_id]
            ]
        # Subclasses (the modular mode) may run calls of their own, without call options.
        applied = {**runtime_options.report(cached.pipeline), **info.get("runtime_options", {})}
        if applied:
            config["runtime_options"] = applied
        if self.executor.cache.budget_bytes:
            config["model_cache"] = {
                "held_bytes": self.executor.cache.held_bytes(),
                "budget_bytes": self.executor.cache.budget_bytes,
            }
        if self.placement.device_map:
            config.update(device_map=self.placement.device_map, devices=list(self.placement.devices))
        if first.num_frames:  # the frames really made (Wan rounds num_frames to 4k+1)
            config["num_frames"] = first.num_frames
        report = run_report(
            self.assignment,
            plan.item,
            self.recorder,
            worker_id=self.executor.config.worker_id,
            execution_mode=self.executor.mode,
            backend=self.placement.backend,
            device=self.placement.device,
            dtype=self.placement.dtype,
            seeds=plan.seeds,
            peak_memory_bytes=self.memory.peak_bytes(),
            config_resolved=config,
            cold_start=self.cold,
            pipeline_class=pipeline_class,
            cache_hits=info.get("cache_hits", {}),
            warnings=[
                *self.cache_warnings,
                *self.call_warnings.get(job_id, []),
                *runtime_options.notes(cached.pipeline),
                *info["warnings"],
            ],
        )
        return ItemOutcome(job_id, result=t.GenerateResult(job_id=job_id, artifacts=artifacts, report=report))
