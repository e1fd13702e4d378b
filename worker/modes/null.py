"""The `null` model family: a model without compute, to test and benchmark the control plane.

Like Triton's identity model, a null model (catalog family `null`, or source `builtin:null`)
goes through the whole worker protocol and does no work: it emits one PROGRESS event per
requested step and returns, per output, an 8x8 single-colour image (colour derived from the
seed, encoded once and cached) with its sha256 and a RunReport shaped like the pipeline's.
It never loads a model and never touches torch or diffusers.

Steps take no time unless the request's `extra.sleep_ms_per_step` says so; then each step
sleeps that long, which makes cancel and deadline tests easy. Cancellation and deadlines are
checked before the run and after every step, with the same JobError codes and messages as the
pipeline. Jobs of a batched assignment run side by side, step by step; one job that stops does
not stop the others.

`NullExecutor` runs them in the workers of the modes the registry (`base`) names for the
family (legacy_call and modular), on the event loop, without the model cache; its reports name
`legacy_call`, the catalog entry's mode, in a modular worker too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import time
from typing import Any

from omnirt import types as t
from omnirt._internal import defaults
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker.export import image as export
from omnirt.worker.failures import JobFailure, stop_error
from omnirt.worker.modes.events import RunRecorder, run_report
from omnirt.worker.modes.executor import CancelFlags, EventSink, FamilyExecutor, StopCheck
from omnirt.worker.pipelines.args import INVALID_ARGUMENT, ItemPlan, resolved_config
from omnirt.worker.runtime import backends
from omnirt.worker.runtime.backends import current_rss_bytes
from omnirt.worker.tiny import registry as tiny_models

NULL_FAMILY = "null"
NULL_SOURCE = tiny_models.BUILTIN_PREFIX + tiny_models.NULL_MODEL  # builtin:null
PIPELINE_CLASS = "NullPipeline"
MODE = ExecutionMode.LEGACY_CALL  # what its reports name, in a modular worker too
IMAGE_SIZE = 8
SLEEP_EXTRA = "sleep_ms_per_step"
MAX_SLEEP_MS_PER_STEP = 60_000.0
# The report's memory figure is read at most this often: reading /proc for every job would cost
# more than the rest of a null job.
RSS_REFRESH_S = 0.1
_rss: tuple[float, int] = (-RSS_REFRESH_S, 0)  # (monotonic time read, bytes)


def seed_colour(seed: int) -> tuple[int, int, int]:
    """The RGB colour of the image for `seed` (a multiplicative hash: neighbouring seeds differ)."""
    mixed = (seed * 0x9E3779B1) & 0xFFFFFF
    return (mixed >> 16) & 0xFF, (mixed >> 8) & 0xFF, mixed & 0xFF


@functools.lru_cache(maxsize=4096)
def encoded_image(colour: tuple[int, int, int], fmt: str) -> tuple[bytes, str]:
    """The encoded 8x8 image of `colour` in `fmt` and its sha256 (cached: seeds repeat in benchmarks)."""
    from PIL import Image

    data = export.encode_image(Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), colour), fmt)
    return data, hashlib.sha256(data).hexdigest()


def null_artifact(seed: int, index: int, job_id: str, fmt: str) -> t.Artifact:
    """Output `index` of a job: the 8x8 image of `seed`'s colour."""
    data, sha256 = encoded_image(seed_colour(seed), fmt)
    _, mime, ext = export.IMAGE_FORMATS[fmt]
    return t.Artifact(
        index=index,
        kind=t.MediaKind.IMAGE,
        mime_type=mime,
        data=data,
        size_bytes=len(data),
        sha256=sha256,
        width=IMAGE_SIZE,
        height=IMAGE_SIZE,
        seed=seed,
        file_name=f"{job_id}-{index}.{ext}",
    )


def _rss_bytes() -> int:
    global _rss
    now = time.monotonic()
    if now - _rss[0] >= RSS_REFRESH_S:
        _rss = (now, current_rss_bytes())
    return _rss[1]


def _sleep_ms(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobFailure(
            INVALID_ARGUMENT, f"{SLEEP_EXTRA} must be a number (got {value!r})", f"extra.{SLEEP_EXTRA}"
        )
    if not 0 <= value <= MAX_SLEEP_MS_PER_STEP:
        raise JobFailure(
            INVALID_ARGUMENT,
            f"{SLEEP_EXTRA} must be between 0 and {MAX_SLEEP_MS_PER_STEP:.0f} (got {value})",
            f"extra.{SLEEP_EXTRA}",
        )
    return float(value)


def _positive(value: int | None, fallback: int) -> int:
    return value if value is not None and value > 0 else fallback


def plan_null_item(item: AssignmentItem, spec: t.ModelSpec) -> tuple[ItemPlan, float]:
    """One job's plan (request values, else the model's defaults) and its sleep per step in ms.

    Raises JobFailure naming the field for a bad request.
    """
    # The controller's rule for defaults and seeds, again (a no-op on a validated request).
    req = dataclasses.replace(item.request)
    defaults.apply(req, spec)
    assert req.num_outputs is not None and req.seed is not None
    num_outputs = req.num_outputs
    if num_outputs < 1:
        raise JobFailure(INVALID_ARGUMENT, "num_outputs must be at least 1", "num_outputs")
    try:
        fmt = export.image_format(req.output_format)
    except ValueError as exc:
        raise JobFailure(INVALID_ARGUMENT, str(exc), "output.format") from exc
    sleep_ms = 0.0
    specific: dict[str, Any] = {}
    for key, value in req.extra.items():
        if key != SLEEP_EXTRA:
            raise JobFailure(INVALID_ARGUMENT, f"the null pipeline does not take {key!r}", f"extra.{key}")
        sleep_ms = _sleep_ms(value)
        # google.protobuf.Struct carries every number as a double; integral ones go back to int.
        specific[key] = int(value) if float(value).is_integer() else value
    if req.strength is not None:
        specific["strength"] = req.strength
    common: dict[str, Any] = {
        "width": req.width if req.width and req.width > 0 else IMAGE_SIZE,
        "height": req.height if req.height and req.height > 0 else IMAGE_SIZE,
        "num_inference_steps": req.num_inference_steps
        if req.num_inference_steps and req.num_inference_steps > 0
        else 1,
    }
    if req.guidance_scale is not None:
        common["guidance_scale"] = req.guidance_scale
    plan = ItemPlan(
        item=item,
        num_outputs=num_outputs,
        seeds=defaults.output_seeds(req.seed, num_outputs),
        output_format=fmt,
        scheduler=req.scheduler or "",
        common=common,
        specific=specific,
    )
    return plan, sleep_ms


class NullRun:
    """One assignment on the null pipeline; the drivers (`run_null`, `run_null_sync`) do the waiting."""

    def __init__(
        self, assignment: Assignment, emit: EventSink, flags: CancelFlags, *, worker_id: str, backend: str
    ) -> None:
        self.assignment = assignment
        self.spec = assignment.model
        self.worker_id = worker_id
        self.recorder = RunRecorder(emit)
        self.stop = StopCheck(flags, assignment)
        self.placement = _placement(backend, self.spec.runtime)
        self.outcomes: dict[str, ItemOutcome] = {}
        self.active: list[tuple[ItemPlan, float]] = []
        self.denoise_start = time.perf_counter()

    def step_delay_s(self) -> float:
        """How long the next step takes: the longest sleep any running job asked for."""
        return max((sleep_ms for _, sleep_ms in self.active), default=0.0) / 1000.0

    def begin(self) -> None:
        """RUNNING events, plans, the stop check before start, and the start of `denoise`."""
        for item in self.assignment.items:
            self.recorder.running(item.job_id, self.worker_id, item.attempt)
        for item in self.assignment.items:
            try:
                plan, sleep_ms = plan_null_item(item, self.spec)
            except JobFailure as failure:
                self._fail(item.job_id, failure.error)
                continue
            reason = self.stop.reason(item.job_id)
            if reason:
                self.outcomes[item.job_id] = ItemOutcome(
                    item.job_id, error=stop_error(reason, "before start")
                )
                continue
            self.active.append((plan, sleep_ms))
        self.denoise_start = time.perf_counter()
        self.recorder.stage_started([plan.job_id for plan, _ in self.active], "denoise")

    def step(self, step: int) -> None:
        """Step `step` (1-based) is done: progress, stop checks, results of the jobs it completes."""
        still = []
        for plan, sleep_ms in self.active:
            total = plan.common["num_inference_steps"]
            self.recorder.progress([plan.job_id], step, total)
            reason = self.stop.reason(plan.job_id)
            if reason:
                self.outcomes[plan.job_id] = ItemOutcome(
                    plan.job_id, error=stop_error(reason, "while running")
                )
            elif step >= total:
                self.recorder.stage_finished([plan.job_id], "denoise", self.denoise_start)
                self.outcomes[plan.job_id] = self._result(plan)
            else:
                still.append((plan, sleep_ms))
        self.active = still

    def finish(self) -> list[ItemOutcome]:
        """One outcome per item, in item order."""
        missing = t.JobError("INTERNAL", "the null pipeline produced no outcome for this job")
        return [
            self.outcomes.get(i.job_id) or ItemOutcome(i.job_id, error=missing) for i in self.assignment.items
        ]

    def _fail(self, job_id: str, error: t.JobError) -> None:
        self.outcomes[job_id] = ItemOutcome(job_id, error=error)

    def _result(self, plan: ItemPlan) -> ItemOutcome:
        job_id = plan.job_id
        export_start = time.perf_counter()
        self.recorder.stage_started([job_id], "export")
        artifacts = [null_artifact(seed, i, job_id, plan.output_format) for i, seed in enumerate(plan.seeds)]
        self.recorder.stage_finished([job_id], "export", export_start)
        extra = {
            "dtype": self.placement.dtype,
            "device": self.placement.device,
            "pipeline_class": PIPELINE_CLASS,
            "source": self.spec.source or self.spec.id,
        }
        if plan.scheduler:
            extra["scheduler"] = plan.scheduler
        report = run_report(
            self.assignment,
            plan.item,
            self.recorder,
            worker_id=self.worker_id,
            execution_mode=MODE,
            backend=self.placement.backend,
            device=self.placement.device,
            dtype=self.placement.dtype,
            seeds=plan.seeds,
            peak_memory_bytes=_rss_bytes(),
            config_resolved=resolved_config(plan, extra),
            pipeline_class=PIPELINE_CLASS,
        )
        return ItemOutcome(job_id, result=t.GenerateResult(job_id=job_id, artifacts=artifacts, report=report))


def _placement(backend: str, runtime: dict[str, Any]) -> backends.Placement:
    """What the report names as backend, device and dtype (nothing runs there)."""
    try:
        return backends.placement_for(backend, runtime)
    except backends.BackendError:  # an unresolved `auto`, or a dtype the null model never uses
        return backends.placement_for(backend if backend in backends.DEVICES else "cpu")


YIELD_EVERY = 64


async def run_null(
    assignment: Assignment, emit: EventSink, flags: CancelFlags, *, worker_id: str, backend: str
) -> list[ItemOutcome]:
    """Run `assignment` on the event loop (no thread): `emit` is called on the loop's thread."""
    run = NullRun(assignment, emit, flags, worker_id=worker_id, backend=backend)
    run.begin()
    step = 0
    while run.active:
        step += 1
        # Sleeping steps yield, which lets heartbeats, other jobs and cancels through; steps
        # without a delay yield only every YIELD_EVERY steps, so a short job's events and result
        # reach the stream together (one write instead of one per step).
        delay = run.step_delay_s()
        if delay > 0 or step % YIELD_EVERY == 0:
            await asyncio.sleep(delay)
        run.step(step)
    return run.finish()


def run_null_sync(
    assignment: Assignment, emit: EventSink, flags: CancelFlags, *, worker_id: str, backend: str
) -> list[ItemOutcome]:
    """`run_null` in the calling thread (blocks while it sleeps)."""
    run = NullRun(assignment, emit, flags, worker_id=worker_id, backend=backend)
    run.begin()
    step = 0
    while run.active:
        step += 1
        delay = run.step_delay_s()
        if delay:
            time.sleep(delay)
        run.step(step)
    return run.finish()


class NullExecutor(FamilyExecutor):
    """The null family's executor, in front of a legacy_call or modular worker's own."""

    mode = MODE
    family = NULL_FAMILY
    source = NULL_SOURCE

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        # No compute, so no thread: it runs on the loop and never reaches the model cache.
        return await run_null(assignment, emit, flags, worker_id=self.config.worker_id, backend=self.backend)

    def run_sync(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """`run` without the event loop: blocks; `emit` is called from this thread."""
        return run_null_sync(assignment, emit, flags, worker_id=self.config.worker_id, backend=self.backend)

    async def preload(self, spec: t.ModelSpec) -> None:
        """Nothing to load."""
        return None
