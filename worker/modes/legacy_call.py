"""`LegacyCallExecutor`: the `legacy_call` execution mode, a diffusers pipeline called as is.

One assignment = one model; its items are grouped by compatible settings and each group is
one pipeline call (prompts as a list, one generator per output), so a batch from the
controller's batcher runs as a single call. The blocking call runs in a thread; progress,
cancellation and deadlines go through `callback_on_step_end`. Planning, loading and grouping are
`AssignmentRun`'s (`omnirt.worker.modes.assignment`, shared with `modular`); this mode's
`LegacyCallRun` makes each group one pipeline call.

Stage timings: `load` is the model cache load (absent when warm); `denoise` runs from the
call's start (text encoding included) to the last step callback; `decode` from the last step
callback to the call's return (the pipeline decodes internally); `export` is the encoding of
the call's outputs (`output_export`: a batch's encode at once, and its jobs' results leave together).

Models of the `null` family (no compute, for control-plane tests and benchmarks) never reach
this executor: the registry puts `omnirt.worker.modes.null`'s executor in front of it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.export import outputs as output_export
from omnirt.worker.failures import JobFailure, ModelInUse, StopRun, stop_error
from omnirt.worker.modes import step_engine
from omnirt.worker.modes.assignment import AssignmentRun
from omnirt.worker.modes.events import StepMonitor, ThreadEvents, attach_step_hook, first_outputs
from omnirt.worker.modes.executor import CancelFlags, EventSink, Executor
from omnirt.worker.modes.schedulers import call_view, fresh_scheduler, own_tokenizers, seed_noise_sampler
from omnirt.worker.modes.step_engine import Member, StepEngine
from omnirt.worker.pipelines import clip_skip, media_inputs
from omnirt.worker.pipelines import tasks as task_pipelines
from omnirt.worker.pipelines.args import ItemPlan, call_kwargs, call_parameters
from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache
from omnirt.worker.pipelines.previews import PreviewMaker
from omnirt.worker.realtime import speech_session, talking_head_session
from omnirt.worker.realtime.api import OpenRequest, SessionRefused, StreamingSession
from omnirt.worker.runtime import adapters, backends, inference_mode, quantization, step_cache
from omnirt.worker.runtime import options as runtime_options

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


def prompt_kwargs(group: list[ItemPlan]) -> dict[str, Any]:
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
        # `is None`: an empty cache is falsy (it has a length) and must still be shared.
        self.cache = cache if cache is not None else ModelCache(config.model_dir, config.model_cache_bytes)
        self.inputs = media_inputs.InputPolicy.of(config)
        self._backend = ""
        self._start_lock = threading.Lock()
        self.talking_heads = talking_head_session.ResidentTalkingHeads(
            config.model_dir
        )  # realtime sessions' models
        self.speaking = speech_session.SpeakingSessions(self.cache)  # sessions that take text
        # Concurrent calls of the step engine's families share each denoiser step (`step_engine`).
        self.steps = (
            StepEngine(
                rows=config.step_rows,
                max_paused=config.step_max_paused,
                max_paused_bytes=config.step_max_paused_bytes,
                max_pause_s=config.step_max_pause_s,
            )
            if config.step_engine
            else None
        )

    @property
    def backend(self) -> str:
        return self._backend or self.config.backend

    def start_sync(self) -> str:
        """The backend in use, detected (and diffusers imported) on the first call."""
        with self._start_lock:
            if not self._backend:
                import diffusers  # noqa: F401  (the first import takes seconds: pay it before any job)

                _quiet_libraries()
                backend = backends.detect_backend(self.config.backend)
                backends.configure_threads(self.config.torch_threads)
                self._backend = backend
            return self._backend

    async def start(self) -> None:
        await asyncio.to_thread(self.start_sync)

    def loaded_models(self) -> list[str]:
        return sorted({*self.cache.loaded_models(), *self.talking_heads.loaded_models()})

    def open_session(self, request: OpenRequest) -> StreamingSession:
        """A realtime session in this process: a talking head (its pipeline stays resident), a
        speech model's, or a talking head that also speaks text (`speech_session`)."""
        try:
            placement = backends.placement_for(self.start_sync(), request.model.runtime)
        except backends.BackendError as exc:
            raise SessionRefused("FAILED_PRECONDITION", str(exc), "model") from exc
        speaking = self.speaking.open(request, placement, self.talking_heads)
        return speaking if speaking is not None else self.talking_heads.open(request, placement)

    async def preload(self, spec: t.ModelSpec) -> None:
        """Load `spec` into the model cache now (`--preload`), so its first job finds it warm."""

        def load() -> None:
            placement = backends.placement_for(self.start_sync(), spec.runtime)
            speaker = speech_session.speech_spec(spec)
            if speaker is not None and speaker is not spec:  # a talking head's speech model
                self.cache.release(self.cache.get(speaker, placement))
            if talking_head_session.is_streaming_class(spec.pipeline_class):
                self.talking_heads.pipeline(spec, placement)  # SessionRefused: logged by the daemon
                return
            self.cache.release(self.cache.get(spec, placement))

        await asyncio.to_thread(load)

    def model_memory(self) -> dict[str, int]:
        return self.cache.model_bytes()

    def step_engine(self) -> tuple[int, list[str]]:
        if self.steps is None:
            return 0, []
        return self.steps.rows, sorted(step_engine.PIPELINES)

    async def unload(self, model_id: str) -> bool:
        """Free `model_id` from the model cache (ModelInUse while a run or session holds it)."""
        dropped, in_use = await asyncio.to_thread(self.cache.evict, model_id)
        if in_use:
            raise ModelInUse(f"model {model_id!r} is in use by a run or a realtime session")
        return dropped

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        events = ThreadEvents(asyncio.get_running_loop(), emit, self.config.progress_interval_ms / 1000)
        return await events.run(self.run_sync, assignment, events, flags)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        return LegacyCallRun(self, assignment, emit, flags).execute()


class LegacyCallRun(AssignmentRun):
    """One assignment in the legacy_call mode: each group of compatible plans is one pipeline call."""

    executor: LegacyCallExecutor
    takes_request_options = True

    # ---- one pipeline call ---------------------------------------------------------------

    def run_group(self, cached: CachedPipeline, group: list[ItemPlan]) -> None:
        """The group in one pipeline call (prompts as a list, one generator per output)."""
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
                    images, call_info = self._call(pipeline, group, options, exclusive)
                except (StopRun, JobFailure):
                    raise
                except Exception as exc:
                    if not runtime_options.is_compiled(cached.pipeline):
                        raise
                    runtime_options.drop_compile(cached.pipeline, exc)  # and run once more, eagerly
                    images, call_info = self._call(pipeline, group, options, exclusive)
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
                self.outcomes[plan.job_id] = self.result(plan, artifacts, cached, call_info)
            except Exception as exc:
                log.exception("export failed")
                self.fail(
                    [plan.job_id], t.JobError("INTERNAL", f"export failed: {type(exc).__name__}: {exc}")
                )

    def _call(
        self,
        pipeline: Any,
        group: list[ItemPlan],
        options: runtime_options.Effective,
        exclusive: bool = False,
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        """One pipeline call for `group`; returns each plan's images and facts for the report.

        In the step engine when it takes the pipeline, and the call holds it with others (LoRA
        adapters too: the calls of one set hold it together); a step cache (`exclusive`) hooks
        the whole denoiser, so that call runs alone and says why.
        """
        engine = self.executor.steps if step_engine.eligible(pipeline) else None
        if engine is None or exclusive:
            images, info = self._call_with(pipeline, group, options, None)
            if engine is not None:
                reason = "the step cache hooks the whole denoiser: the call runs alone"
                info["step_engine"] = {"used": False, "reason": reason}
            return images, info
        priority = max(p.item.request.priority for p in group)
        job_ids = [p.job_id for p in group]
        with engine.member(job_ids, priority, lambda text: self.recorder.note(job_ids, text)) as member:
            images, info = self._call_with(pipeline, group, options, member)
        info["step_engine"] = {"used": True, **member.report()}
        return images, info

    def _call_with(
        self,
        pipeline: Any,
        group: list[ItemPlan],
        options: runtime_options.Effective,
        member: Member | None,
    ) -> tuple[list[list[Any]], dict[str, Any]]:
        import torch

        first = group[0]
        job_ids = [p.job_id for p in group]
        # A shallow copy with its own scheduler: schedulers keep per-call state, and several
        # slots may run the same cached pipeline at once. The weights stay shared.
        view = call_view(pipeline)
        scheduler, warnings = fresh_scheduler(pipeline.scheduler, first.scheduler)
        if type(scheduler) is type(pipeline.scheduler):
            # The config already names this class: skip diffusers' __setattr__ rewriting it.
            object.__setattr__(view, "scheduler", scheduler)
        else:
            view.scheduler = scheduler
        call_options, notes = runtime_options.call_vae(view, options.call())
        warnings += notes
        accepted = call_parameters(view)
        generic = {**first.common, **first.specific, **prompt_kwargs(group)}
        if first.fps:
            generic["fps"] = first.fps
        kwargs = call_kwargs(generic, accepted)
        device = self.placement.device
        seeds = [seed for p in group for seed in p.seeds]
        kwargs["generator"] = [torch.Generator(device).manual_seed(seed) for seed in seeds]
        seed_noise_sampler(view.scheduler, seeds)
        preview = options.call().get("preview")
        previews = None
        if preview:
            size = (int(first.common.get("width") or 0), int(first.common.get("height") or 0))
            previews = PreviewMaker(preview, self.spec.family, *size)
            call_options["preview"] = preview
        firsts = first_outputs([p.num_outputs for p in group])
        monitor = StepMonitor(
            self.recorder,
            self.stop,
            job_ids,
            int(first.common.get("num_inference_steps", 0)),
            previews,
            firsts,
        )
        if member is not None:
            assert self.executor.steps is not None
            self.executor.steps.share(view, member)
        attach_step_hook(view, accepted, kwargs, _leaving(monitor, member, self.executor.steps))

        # Reported when it is not the default: set by the catalog or request, or off for this pipeline.
        setting = options.values.get(inference_mode.NAME)
        in_inference_mode = inference_mode.use_inference_mode(view, setting)
        if setting is not None or not in_inference_mode:
            call_options[inference_mode.NAME] = in_inference_mode
        with (
            own_tokenizers(view),
            clip_skip.text_model_view(view, kwargs),
            inference_mode.call_context(in_inference_mode),
            step_cache.enabled(view, options, int(first.common.get("num_inference_steps", 0))) as usage,
        ):
            monitor.start()
            output = view(**kwargs)
            monitor.finish()
        cache_hits = {}
        if usage is not None:
            call_options[step_cache.NAME] = options.call()[step_cache.NAME]
            cache_hits[step_cache.NAME] = usage.reused

        images = task_pipelines.call_outputs(output, view)  # images, frame arrays or clips
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


def _leaving(monitor: StepMonitor, member: Member | None, engine: StepEngine | None) -> Any:
    """The call's step hook: `monitor`, then, at the last step, the call leaves the engine's
    batch (its decode and export run while the other rows take their next step)."""
    if member is None or engine is None:
        return monitor

    def hook(pipe: Any, step_index: int, timestep: Any, callback_kwargs: dict[str, Any]) -> dict[str, Any]:
        tensors = monitor(pipe, step_index, timestep, callback_kwargs)
        if step_index + 1 < monitor.total_steps:
            return tensors
        engine.leave(member)
        # Rows do not mix in a forward, so a row gone to NaN or inf harms only its own job: it
        # fails here, before its decode. Checked once, at the last step: on CUDA the check waits
        # for the device, which every step would pay.
        latents = tensors.get("latents")
        if latents is not None and not bool(latents.isfinite().all()):
            raise JobFailure(
                "INTERNAL",
                f"the latents are not finite after step {step_index + 1} (guidance_scale or the "
                "scheduler's settings out of range for this model)",
            )
        return tensors

    return hook
