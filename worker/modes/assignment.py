"""`AssignmentRun`: one assignment of a diffusers-pipeline mode while it runs, the part those modes share.

`legacy_call` (the whole pipeline in one call) and `modular` (the pipeline stage by stage) run an
assignment the same way up to the call itself: the jobs are planned (runtime options, pipeline
arguments, seeds), the jobs that must stop are dropped, the model is loaded once per set of load
options, adapters are resolved, and the plans that may share a call (same settings, adapters and
runtime options) are grouped. Each mode then runs a group its own way (`run_group`), and the
results are made and failures reported the same way (`result`, `fail`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker import redact
from omnirt.worker.config import WorkerConfig
from omnirt.worker.failures import JobFailure, stop_error
from omnirt.worker.modes.events import RunRecorder, run_report
from omnirt.worker.modes.executor import CancelFlags, EventSink, StopCheck
from omnirt.worker.pipelines import media_inputs, model_cache
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import (
    ItemPlan,
    call_parameters,
    check_arguments,
    pipeline_kwargs,
    plan_item,
    resolved_config,
)
from omnirt.worker.pipelines.loader import ModelLoadError
from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache
from omnirt.worker.runtime import adapters, backends, step_cache
from omnirt.worker.runtime import options as runtime_options
from omnirt.worker.runtime.backends import PeakMemory

log = logging.getLogger(__name__)


class PipelineExecutor(Protocol):
    """What an `AssignmentRun` needs of its executor (`LegacyCallExecutor` and the modes built on it)."""

    config: WorkerConfig
    cache: ModelCache
    inputs: media_inputs.InputPolicy

    @property
    def mode(self) -> ExecutionMode:
        """The executor's execution mode."""

    def start_sync(self) -> str:
        """The backend in use, detected (and the libraries imported) on the first call."""


def _without_runtime(item: AssignmentItem) -> AssignmentItem:
    """`item` without `extra["runtime"]` (runtime options, not a pipeline argument)."""
    extra = item.request.extra
    if runtime_options.REQUEST_KEY not in extra:
        return item
    rest = {k: v for k, v in extra.items() if k != runtime_options.REQUEST_KEY}
    return dataclasses.replace(item, request=dataclasses.replace(item.request, extra=rest))


class AssignmentRun(ABC):
    """The state of one assignment while it runs, and the steps every pipeline mode shares.

    `execute` plans each job, loads the model (once per set of load options), checks each plan
    against its pipeline, resolves its adapters and groups the plans that may share a call. A mode
    subclasses this and overrides `run_group`: run one group of compatible plans (loaded, adapters
    resolved, options in `options`) and fill `outcomes`, through `result` for a job's artifacts and
    `fail` for a job that cannot finish. `takes_request_options` says whether the mode applies
    runtime options per request (`extra.runtime`); a mode that does not refuses them.
    """

    takes_request_options: ClassVar[bool] = False

    def __init__(
        self, executor: PipelineExecutor, assignment: Assignment, emit: EventSink, flags: CancelFlags
    ) -> None:
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
        """Fail `job_ids` with `error` (a job keeps its first outcome)."""
        # Every error of the pipeline modes leaves through here: none shows a worker path.
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
        """Run the assignment; one outcome per item, in item order (never raises for a job)."""
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
            backend = self.executor.start_sync()
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
                if not self.takes_request_options and runtime_options.REQUEST_KEY in item.request.extra:
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
                task_pipelines.check_audio(pipeline, plan.task, plan.specific, plan.output_format)
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
            self.run_group(cached, group)

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

    @abstractmethod
    def run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        """Run one group of plans that may share a call, filling `outcomes`; what a mode defines."""

    # ---- results -------------------------------------------------------------------------

    def result(
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
        if "step_engine" in info:  # the step engine's share of the call (legacy_call)
            config["step_engine"] = info["step_engine"]
        if self.executor.cache.budget_bytes:
            config["model_cache"] = {
                "held_bytes": self.executor.cache.held_bytes(),
                "budget_bytes": self.executor.cache.budget_bytes,
            }
        if self.placement.device_map:
            config.update(device_map=self.placement.device_map, devices=list(self.placement.devices))
        if first.num_frames:  # the frames really made (Wan rounds num_frames to 4k+1)
            config["num_frames"] = first.num_frames
        if first.kind is t.MediaKind.AUDIO:  # a clip has no size: its rate, channels and length
            config.pop("width", None), config.pop("height", None)
            config.update(sample_rate=first.sample_rate, channels=first.channels)
            config["duration_ms"] = first.duration_ms
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
