"""`PersistentWorkerExecutor`: the `persistent_worker` execution mode.

Each model gets a resident process group (`ResidentGroup`: torchrun, one rank per
`runtime.nproc_per_node`), started when the worker starts (`preload`, the daemon's `--preload`,
on by default in this mode) or else on its first assignment, and kept until it idles out
(`runtime.idle_unload_s`) or the worker stops. The model is loaded and `torch.distributed`
initialised once per start; requests then cost only their compute. The rank program runs,
by `runtime.parallel` (any diffusers family through its pipeline's own `__call__`,
`pipeline_call`: `cfg` splits classifier-free guidance across 2 ranks, `data` a batch's
outputs, `ulysses`/`ring` the denoiser's sequence, `none` runs on rank 0; the compatible jobs
of an assignment go as one request; image2image, inpaint and image2video jobs too, their
images shipped as bytes, `inputs`) or else by `runtime.program` (Stable Diffusion
text-to-image written from its components: `cfg_parallel`, the default, `cfg_denoise`, one
job per request; `data_parallel`, a batch's outputs split across ranks).

Requests run one at a time per group. Events per job: RUNNING; `load` start/end on the first
job after a (re)start that was not a preload, and on a job that waited for a start
(`cold_start` true; the timing is the group's start: spawn, dist init, model load, or the part
of it the job waited for; its offset is negative when the group started before the job
arrived); `denoise` start, one `progress` per step, `denoise` end, `decode` start/end, `export`
start/end. Cancel and deadline are checked at every step (rank 0 waits for the daemon's answer
and broadcasts it). A group that dies fails its job with UNAVAILABLE (the controller retries
it) and is restarted with backoff. A `TalkingHeadPipeline` model runs no jobs: its group
serves realtime sessions (`open_session`; `session` on this side, `streaming` on the ranks).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import threading
import time
from typing import Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.export import outputs as output_export
from omnirt.worker.failures import JobFailure, ModelInUse, stop_error
from omnirt.worker.modes.events import RunRecorder, ThreadEvents, run_report
from omnirt.worker.modes.executor import CancelFlags, EventSink, Executor, StopCheck
from omnirt.worker.modes.persistent import inputs as media
from omnirt.worker.modes.persistent import session
from omnirt.worker.modes.persistent.group import Aborted, Lease, ResidentGroup
from omnirt.worker.modes.persistent.launch import GroupError, LaunchSpec, launch_spec
from omnirt.worker.pipelines import media_inputs
from omnirt.worker.pipelines.args import INVALID_ARGUMENT, ItemPlan, plan_item, resolved_config
from omnirt.worker.realtime.api import OpenRequest, StreamingSession
from omnirt.worker.runtime import backends
from omnirt.worker.runtime import options as runtime_options

log = logging.getLogger(__name__)

MODE = ExecutionMode.PERSISTENT_WORKER


def check_supported(plan: ItemPlan, generic: bool = False) -> None:
    """The Stable Diffusion loops take prompts, size, steps, guidance, seeds and scheduler; the
    pipeline program (`generic`) also the pipeline's own extras, media inputs and strength (the
    ranks check them by its signature, `inputs` ships the media). Neither takes adapters."""
    req = plan.item.request
    for key in [] if generic else req.extra:
        raise JobFailure(INVALID_ARGUMENT, f"the persistent pipeline does not take {key!r}", f"extra.{key}")
    if req.inputs and not generic:
        raise JobFailure(INVALID_ARGUMENT, "the persistent pipeline takes no media inputs", "inputs")
    if req.strength is not None and not generic:
        raise JobFailure(INVALID_ARGUMENT, "the persistent pipeline does not take 'strength'", "strength")
    if req.adapters:  # the ranks load the model once; they have no per-request LoRA
        raise JobFailure(INVALID_ARGUMENT, "the persistent pipeline does not apply adapters", "adapters")


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
        self.inputs = media_inputs.InputPolicy.of(config)  # file:// inputs the daemon may read
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

    def preload_sync(self, spec: t.ModelSpec) -> None:
        """Start `spec`'s group and wait until it is ready; GroupError when it cannot start."""
        launch, _ = launch_spec(spec, self.backend, self.config)
        self.group_for(launch).preload()

    async def preload(self, spec: t.ModelSpec) -> None:
        await asyncio.to_thread(self.preload_sync, spec)

    async def unload(self, model_id: str) -> bool:
        """Stop `model_id`'s group (ModelInUse while a request or session uses it); its next
        job starts a new one."""
        with self._lock:  # before any await: no run of the daemon's can start in between
            group = self._groups.get(model_id)
            if group is None:
                return False
            if group.in_use:
                raise ModelInUse(f"model {model_id!r} is in use by a request or a realtime session")
            del self._groups[model_id]
        await asyncio.to_thread(group.close)
        return True

    def open_session(self, request: OpenRequest) -> StreamingSession:
        """A realtime session on the resident group of `request.model` (`session`, `streaming`)."""
        return session.open_session(self, request)

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        events = ThreadEvents(asyncio.get_running_loop(), emit, self.config.progress_interval_ms / 1000)
        return await events.run(self.run_sync, assignment, events, flags)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        return _PersistentRun(self, assignment, emit, flags).execute()

    def close_sync(self) -> None:
        """Stop every group (idempotent)."""
        with self._lock:
            groups, self._groups = list(self._groups.values()), {}
        # In parallel: each group's ranks take a moment to wind down.
        closers = [threading.Thread(target=group.close, daemon=True) for group in groups]
        for closer in closers:
            closer.start()
        for closer in closers:
            closer.join()

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
        try:
            return launch_spec(self.spec, self.executor.backend, self.executor.config)
        except GroupError as exc:
            for job_id in self.assignment.job_ids:
                self.fail(job_id, t.JobError(exc.code, str(exc)))
            return None

    def _execute(self) -> None:
        resolved = self._launch_spec()
        if resolved is None:
            return
        spec, placement = resolved
        if spec.settings.streaming:
            for job_id in self.assignment.job_ids:
                message = (
                    f"model {self.spec.id!r} is a streaming model: it serves realtime sessions, not jobs"
                )
                self.fail(job_id, t.JobError("FAILED_PRECONDITION", message, "model"))
            return
        generic = spec.settings.program == "pipeline"
        policy = self.executor.inputs.for_model(self.spec)
        plans = []
        for item in self.assignment.items:
            try:
                plan = plan_item(item, self.spec)
                check_supported(plan, generic)
                plans.append(media.shipped(plan, policy) if generic else plan)
            except JobFailure as failure:
                self.fail(item.job_id, failure.error)
        if not plans:
            return
        group = self.executor.group_for(spec)
        for batch in self._batches(plans, group.settings.program):
            kept = []
            for plan in batch:
                reason = self.stop.reason(plan.job_id)
                if reason:
                    self.fail(plan.job_id, stop_error(reason, "before start"))
                else:
                    kept.append(plan)
            if kept:
                self._run_work(group, kept, placement)

    @staticmethod
    def _batches(plans: list[ItemPlan], program: str) -> list[list[ItemPlan]]:
        """One request per job (cfg_parallel), or per group of compatible jobs (data_parallel, and
        the pipeline program, whose jobs must also agree on their extras: the ranks fill
        `specific` from them only once the pipeline is known)."""
        if program == "cfg_parallel":
            return [[plan] for plan in plans]
        batches: dict[tuple[str, str], list[ItemPlan]] = {}
        for plan in plans:
            extra = json.dumps(plan.item.request.extra, sort_keys=True, default=str)
            batches.setdefault((plan.group_key(), extra), []).append(plan)
        return list(batches.values())

    def _run_work(self, group: ResidentGroup, plans: list[ItemPlan], placement: backends.Placement) -> None:
        """One request to the group: one job (`{"job": ...}`), a data-parallel batch (`{"jobs": [...]}`)
        or a batch of the pipeline program (`{"call": {...}}`)."""
        ids = [plan.job_id for plan in plans]
        program = group.settings.program
        batched = program == "data_parallel"
        work: dict[str, Any] = {"job": job_fields(plans[0])}
        if program == "pipeline":  # the plans as they are: the ranks build legacy_call's arguments
            call = {"plans": plans, "parallel": group.settings.parallel, "model": self.spec}
            # The model's `preview` option (checked with the catalog): rank 0 makes the previews.
            try:
                call["preview"] = runtime_options.model_options(self.spec.runtime).get("preview") or {}
            except backends.BackendError as exc:
                for job_id in ids:
                    self.fail(job_id, t.JobError("FAILED_PRECONDITION", str(exc), "runtime.preview"))
                return
            work = {"call": call}
        elif batched:
            work = {"jobs": [job_fields(plan) for plan in plans]}
        waited: list[float] = []
        dispatched: list[float] = []
        last_step: list[float] = []

        def on_wait() -> None:
            waited.append(time.perf_counter())
            self.recorder.stage_started(ids, "load")

        def on_dispatch(lease: Lease) -> None:
            if lease.cold:
                start = lease.record.started
                if not waited:  # started before this job (a restart, or for an earlier job)
                    self.recorder.stage_started(ids, "load")
                else:  # what this job waited for (a preload may have begun before it arrived)
                    start = max(start, waited[0])
                self.recorder.stage_finished(ids, "load", start, lease.record.ready_at)
            dispatched.append(time.perf_counter())
            self.recorder.stage_started(ids, "denoise")

        def on_progress(step: int, total: int, previews: list[Any]) -> bool:
            now = time.perf_counter()
            last_step[:] = [now]
            self.recorder.progress(ids, step, total)
            for index, data, mime_type in previews:
                if not self.stop.reason(ids[index]):
                    self.recorder.preview(ids[index], step, total, data, mime_type)
            # A batch goes on while one of its jobs still wants its result (the others' are dropped).
            stop = self.stop.all_stopped(ids)
            if step >= total and not stop:
                self.recorder.stage_finished(ids, "denoise", dispatched[0], now)
                self.recorder.stage_started(ids, "decode")
            return stop

        def should_abort() -> str | None:
            return self.stop.reason(ids[0]) if self.stop.all_stopped(ids) else None

        try:
            lease, reply = group.run(work, on_progress, on_wait, should_abort, on_dispatch)
        except Aborted:
            for job_id in ids:
                why = self.stop.reason(job_id) or "CANCELLED"
                self.fail(job_id, stop_error(why, "while waiting for the process group"))
            return
        except GroupError as exc:
            for job_id in ids:
                self.fail(job_id, t.JobError(exc.code, str(exc)))
            return
        returned = time.perf_counter()
        kind = reply.get("type")
        if kind == "stopped":
            for job_id in ids:
                self.fail(job_id, stop_error(self.stop.reason(job_id) or "CANCELLED", "while running"))
            return
        if kind != "result":
            code = str(reply.get("code") or "INTERNAL")
            message = str(reply.get("message", "the process group failed"))
            for job_id in ids:
                self.fail(job_id, t.JobError(code, message, str(reply.get("field", ""))))
            return
        if last_step:
            self.recorder.stage_finished(ids, "decode", last_step[0], returned)
        if program == "pipeline":
            per_job = reply["outputs"]
            for index, plan in enumerate(plans):
                plan.specific = dict(reply["specific"][index])  # the extras the ranks accepted
                if index in reply["errors"]:
                    self.fail(plan.job_id, t.JobError(**reply["errors"][index]))
        else:
            per_job = reply["images"] if batched else [reply["images"]]
        finished = []
        for plan, images in zip(plans, per_job, strict=True):
            if images is None:  # refused by the ranks (failed above)
                continue
            reason = self.stop.reason(plan.job_id)
            if reason:  # stopped while the rest of its batch went on: its images are dropped
                self.fail(plan.job_id, stop_error(reason, "while running"))
            else:
                finished.append((plan, images))
        for plan, artifacts in output_export.export_outputs(finished, self.recorder):
            try:
                self.outcomes[plan.job_id] = self._result(plan, artifacts, reply, lease, placement, group)
            except Exception as exc:
                log.exception("export failed")
                self.fail(plan.job_id, t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}"))

    def _result(
        self,
        plan: ItemPlan,
        artifacts: list[t.Artifact] | Exception,
        reply: dict[str, Any],
        lease: Any,
        placement: backends.Placement,
        group: ResidentGroup,
    ) -> ItemOutcome:
        if isinstance(artifacts, Exception):
            raise artifacts
        job_id = plan.job_id
        record = lease.record
        # The task's pipeline (image2image on a text-to-image model: its img2img class), as legacy_call says.
        pipeline_class = reply.get("pipeline_class") or record.pipeline_class or group.spec.pipeline_class
        first = artifacts[0]
        config = resolved_config(
            plan,
            {
                "width": reply.get("width", first.width),
                "height": reply.get("height", first.height),
                "num_inference_steps": reply["num_inference_steps"],
                "scheduler": reply["scheduler"],
                "dtype": placement.dtype,
                "device": placement.device,
                "pipeline_class": pipeline_class,
                "source": self.spec.source,
                "nproc_per_node": record.world_size,
                "dist_backend": group.settings.dist_backend,
                "cfg_parallel": bool(reply.get("cfg_parallel")),
                "program": group.settings.program,
            },
        )
        if "outputs_per_rank" in reply:  # data parallel: how the batch's outputs were split
            config["outputs_per_rank"] = list(reply["outputs_per_rank"])
        if group.settings.program == "pipeline":
            config["parallel"] = reply["parallel"]
            config["cfg_parallel"] = any(s["pattern"] in ("batched", "sequential") for s in reply["split"])
            if reply["split"]:  # what each rank computed: the pattern read, denoiser calls and samples
                config["guidance_split"] = list(reply["split"])
            if reply.get("sequence"):  # context parallel: the tokens each rank's attention took
                config["context_parallel"] = list(reply["sequence"])
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
            execution_mode=MODE,
            backend=placement.backend,
            device=placement.device,
            dtype=placement.dtype,
            seeds=plan.seeds,
            peak_memory_bytes=int(reply.get("peak_memory_bytes", 0)),
            config_resolved=config,
            cold_start=lease.cold,
            pipeline_class=pipeline_class,
            warnings=list(reply.get("warnings", [])),
        )
        return ItemOutcome(job_id, result=t.GenerateResult(job_id=job_id, artifacts=artifacts, report=report))
