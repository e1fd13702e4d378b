"""`PersistentWorkerExecutor`: the `persistent_worker` execution mode.

Each model gets a resident process group (`ResidentGroup`: torchrun, one rank per
`runtime.nproc_per_node`), started on its first assignment and kept until it idles out
(`runtime.idle_unload_s`) or the worker stops. The model is loaded and `torch.distributed`
initialised once per start; requests then cost only their compute. The rank program runs
Stable Diffusion-style text-to-image with classifier-free guidance split across ranks
(`cfg_denoise`).

Jobs run one at a time per group (a batch from the controller runs job by job). Events per
job: RUNNING; `load` start/end on the first job after a (re)start (`cold_start` true, the
timing is the group's start: spawn, dist init, model load; its offset is negative when the
group started before the job arrived); `denoise` start, one `progress` per step, `denoise`
end, `decode` start/end, `export` start/end. Cancel and deadline are checked at every step
(rank 0 waits for the daemon's answer and broadcasts it). A group that dies fails its job
with UNAVAILABLE (the controller retries it) and is restarted with backoff.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import omnirt
from omnirt import types as t
from omnirt.worker import backends, export, tiny_models
from omnirt.worker.config import WorkerConfig
from omnirt.worker.executor import CancelFlags, EventSink, Executor, JobFailure, StopCheck, stop_error
from omnirt.worker.persistent.group import Aborted, Lease, ResidentGroup
from omnirt.worker.persistent.launch import GroupError, LaunchSpec
from omnirt.worker.persistent.settings import GroupSettings, SettingsError
from omnirt.worker.pipeline_args import INVALID_ARGUMENT, ItemPlan, plan_item, resolved_config
from omnirt.worker.protocol import Assignment, ItemOutcome
from omnirt.worker.run_events import RunRecorder

log = logging.getLogger(__name__)

MODE = "persistent_worker"
DEFAULT_PIPELINE_CLASS = "StableDiffusionPipeline"


def _trace_id(trace_context: dict[str, str]) -> str:
    parts = trace_context.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 else ""


def check_supported(plan: ItemPlan) -> None:
    """The rank program takes prompts, size, steps, guidance, seeds and scheduler; nothing else."""
    req = plan.item.request
    for key in req.extra:
        raise JobFailure(INVALID_ARGUMENT, f"the persistent pipeline does not take {key!r}", f"extra.{key}")
    if req.inputs:
        raise JobFailure(INVALID_ARGUMENT, "the persistent pipeline takes no media inputs", "inputs")
    if req.strength is not None:
        raise JobFailure(INVALID_ARGUMENT, "the persistent pipeline does not take 'strength'", "strength")


def job_fields(plan: ItemPlan) -> dict[str, Any]:
    """The request as the ranks receive it (`cfg_denoise.TextJob` fields)."""
    req, common = plan.item.request, plan.common
    fields: dict[str, Any] = {
        "prompt": req.prompt,
        "negative_prompt": req.negative_prompt or "",
        "seeds": list(plan.seeds),
        "scheduler": plan.scheduler,
    }
    for key in ("width", "height", "num_inference_steps"):
        if key in common:
            fields[key] = int(common[key])
    if "guidance_scale" in common:
        fields["guidance_scale"] = float(common["guidance_scale"])
    return fields


class PersistentWorkerExecutor(Executor):
    """Runs assignments on resident torchrun process groups, one group per model."""

    mode = MODE

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self._backend = ""
        self._lock = threading.Lock()
        self._groups: dict[str, ResidentGroup] = {}
        # A worker that exits without close() (an exception in the daemon) still stops its groups.
        atexit.register(self.close_sync)

    @property
    def backend(self) -> str:
        return self._backend or self.config.backend

    async def start(self) -> None:
        self._backend = await asyncio.to_thread(backends.detect_backend, self.config.backend)

    def loaded_models(self) -> list[str]:
        with self._lock:
            return sorted(model_id for model_id, group in self._groups.items() if group.ready)

    def group(self, model_id: str) -> ResidentGroup | None:
        """The process group of `model_id`, if one was created."""
        with self._lock:
            return self._groups.get(model_id)

    def group_for(self, spec: LaunchSpec) -> ResidentGroup:
        """The group of `spec.model_id`, created on first use (replaced when its launch changed)."""
        old = None
        with self._lock:
            group = self._groups.get(spec.model_id)
            if group is None or group.spec.launch_key() != spec.launch_key():
                old, group = group, ResidentGroup(spec)
                self._groups[spec.model_id] = group
            elif group.spec != spec:
                group.update(spec)
        if old is not None:
            log.info("model %s: its catalog entry changed, replacing its process group", spec.model_id)
            threading.Thread(target=old.close, daemon=True).start()
        return group

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        loop = asyncio.get_running_loop()

        def emit_threadsafe(event: t.JobEvent) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone when the worker stops mid-run
                loop.call_soon_threadsafe(emit, event)

        return await asyncio.to_thread(self.run_sync, assignment, emit_threadsafe, flags)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        return _PersistentRun(self, assignment, emit, flags).execute()

    def close_sync(self) -> None:
        """Stop every group (idempotent)."""
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
        for group in groups:
            group.close()

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)


class _PersistentRun:
    """One assignment, job by job, on the model's process group."""

    def __init__(
        self, executor: PersistentWorkerExecutor, assignment: Assignment, emit: EventSink, flags: CancelFlags
    ) -> None:
        self.executor = executor
        self.assignment = assignment
        self.spec = assignment.model
        self.recorder = RunRecorder(emit)
        self.stop = StopCheck(flags, assignment)
        self.outcomes: dict[str, ItemOutcome] = {}

    def fail(self, job_id: str, error: t.JobError) -> None:
        self.outcomes.setdefault(job_id, ItemOutcome(job_id, error=error))

    def execute(self) -> list[ItemOutcome]:
        worker_id = self.executor.config.worker_id
        for item in self.assignment.items:
            self.recorder.running(item.job_id, worker_id, item.attempt)
        try:
            self._execute()
        except Exception as exc:  # a bug here must cost the jobs, never the worker
            log.exception("assignment %s failed", self.assignment.assignment_id)
            for job_id in self.assignment.job_ids:
                self.fail(job_id, t.JobError("INTERNAL", f"{type(exc).__name__}: {exc}"))
        return [self.outcomes[job_id] for job_id in self.assignment.job_ids]

    def _launch_spec(self) -> tuple[LaunchSpec, backends.Placement] | None:
        job_ids = self.assignment.job_ids
        try:
            placement = backends.placement_for(self.executor.backend, self.spec.runtime)
            settings = GroupSettings.from_runtime(self.spec.runtime, placement.backend)
        except (backends.BackendError, SettingsError) as exc:
            for job_id in job_ids:
                self.fail(job_id, t.JobError("FAILED_PRECONDITION", f"model {self.spec.id!r}: {exc}"))
            return None
        source = self.spec.source or self.spec.id
        name = tiny_models.builtin_name(source)
        if name is not None:
            try:  # built here once, so the ranks only load it
                source = str(tiny_models.ensure_builtin(name, self.executor.config.model_dir))
            except tiny_models.BuiltinModelError as exc:
                for job_id in job_ids:
                    self.fail(job_id, t.JobError("FAILED_PRECONDITION", f"model {self.spec.id!r}: {exc}"))
                return None
        spec = LaunchSpec(
            model_id=self.spec.id,
            source=source,
            pipeline_class=self.spec.pipeline_class or DEFAULT_PIPELINE_CLASS,
            device=placement.device,
            dtype=placement.dtype,
            threads=self.executor.config.torch_threads,
            settings=settings,
        )
        return spec, placement

    def _execute(self) -> None:
        plans = []
        for item in self.assignment.items:
            try:
                plan = plan_item(item, self.spec)
                check_supported(plan)
                plans.append(plan)
            except JobFailure as failure:
                self.fail(item.job_id, failure.error)
        if not plans:
            return
        resolved = self._launch_spec()
        if resolved is None:
            return
        spec, placement = resolved
        group = self.executor.group_for(spec)
        for plan in plans:
            reason = self.stop.reason(plan.job_id)
            if reason:
                self.fail(plan.job_id, stop_error(reason, "before start"))
                continue
            self._run_one(group, plan, placement)

    def _run_one(self, group: ResidentGroup, plan: ItemPlan, placement: backends.Placement) -> None:
        job_id = plan.job_id
        ids = [job_id]
        waited: list[float] = []
        dispatched: list[float] = []
        last_step: list[float] = []

        def on_wait() -> None:
            waited.append(time.perf_counter())
            self.recorder.stage_started(ids, "load")

        def on_dispatch(lease: Lease) -> None:
            if lease.cold:
                if not waited:  # started before this job (a restart, or for an earlier job)
                    self.recorder.stage_started(ids, "load")
                self.recorder.stage_finished(ids, "load", lease.record.started, lease.record.ready_at)
            dispatched.append(time.perf_counter())
            self.recorder.stage_started(ids, "denoise")

        def on_progress(step: int, total: int) -> bool:
            now = time.perf_counter()
            last_step[:] = [now]
            self.recorder.progress(ids, step, total)
            stop = self.stop.reason(job_id) is not None
            if step >= total and not stop:
                self.recorder.stage_finished(ids, "denoise", dispatched[0], now)
                self.recorder.stage_started(ids, "decode")
            return stop

        def should_abort() -> str | None:
            return self.stop.reason(job_id)

        try:
            lease, reply = group.run(job_fields(plan), on_progress, on_wait, should_abort, on_dispatch)
        except Aborted as exc:
            self.fail(job_id, stop_error(exc.reason, "while waiting for the process group"))
            return
        except GroupError as exc:
            self.fail(job_id, t.JobError(exc.code, str(exc)))
            return
        returned = time.perf_counter()
        kind = reply.get("type")
        if kind == "stopped":
            self.fail(job_id, stop_error(self.stop.reason(job_id) or "CANCELLED", "while running"))
            return
        if kind != "result":
            code = str(reply.get("code") or "INTERNAL")
            self.fail(
                job_id,
                t.JobError(
                    code, str(reply.get("message", "the process group failed")), str(reply.get("field", ""))
                ),
            )
            return
        if last_step:
            self.recorder.stage_finished(ids, "decode", last_step[0], returned)
        reason = self.stop.reason(job_id)
        if reason:
            self.fail(job_id, stop_error(reason, "while running"))
            return
        try:
            self.outcomes[job_id] = self._result(plan, reply, lease, placement, group)
        except Exception as exc:
            log.exception("export failed")
            self.fail(job_id, t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}"))

    def _result(
        self,
        plan: ItemPlan,
        reply: dict[str, Any],
        lease: Any,
        placement: backends.Placement,
        group: ResidentGroup,
    ) -> ItemOutcome:
        job_id = plan.job_id
        req = plan.item.request
        started = time.perf_counter()
        self.recorder.stage_started([job_id], "export")
        artifacts = [
            export.image_artifact(
                image, index=i, seed=plan.seeds[i], job_id=job_id, fmt=plan.output_format, quality=req.quality
            )
            for i, image in enumerate(reply["images"])
        ]
        self.recorder.stage_finished([job_id], "export", started)
        record = lease.record
        pipeline_class = record.pipeline_class or group.spec.pipeline_class
        config = resolved_config(
            plan,
            {
                "width": reply["width"],
                "height": reply["height"],
                "num_inference_steps": reply["num_inference_steps"],
                "scheduler": reply["scheduler"],
                "dtype": placement.dtype,
                "device": placement.device,
                "pipeline_class": pipeline_class,
                "source": self.spec.source,
                "nproc_per_node": record.world_size,
                "dist_backend": group.settings.dist_backend,
                "cfg_parallel": bool(reply.get("cfg_parallel")),
            },
        )
        report = t.RunReport(
            run_id=str(uuid.uuid4()),
            job_id=job_id,
            worker_id=self.executor.config.worker_id,
            model=self.spec.id,
            task=req.task or (self.spec.tasks[0] if self.spec.tasks else None),
            backend=placement.backend,
            execution_mode=MODE,
            device=placement.device,
            dtype=placement.dtype,
            queue_wait_ms=plan.item.queue_wait_ms,
            timings=list(self.recorder.timings.get(job_id, [])),
            execution_ms=self.recorder.elapsed_ms(),
            peak_memory_bytes=int(reply.get("peak_memory_bytes", 0)),
            config_resolved=config,
            cold_start=lease.cold,
            attempt=plan.item.attempt,
            batch_size=len(self.assignment.items),
            batch_group_id=self.assignment.batch_group_id,
            seeds=list(plan.seeds),
            trace_id=_trace_id(self.assignment.trace_context),
            started_at=self.recorder.started_at,
            finished_at=datetime.now(UTC),
            pipeline_class=pipeline_class,
            omnirt_version=omnirt.__version__,
        )
        return ItemOutcome(job_id, result=t.GenerateResult(job_id=job_id, artifacts=artifacts, report=report))
