"""Validation: a request becomes a resolved plan, or a precise error naming the field."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit

from omnirt._internal import defaults, runtime_schema
from omnirt._internal.defaults import MAX_SEED, planned_steps
from omnirt._internal.families import Family
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.tasks import REQUIRED_INPUTS
from omnirt.controller.core import bounds
from omnirt.controller.core.bounds import INT32_MAX, MAX_TIMEOUT_MS, Violations, bad, echo
from omnirt.controller.core.catalog import PRESET_RUNTIME, Catalog
from omnirt.errors import FailedPrecondition, InvalidRequest, OmniRTError
from omnirt.types import GenerateRequest, MediaKind, ModelSpec, Preset, Task, Webhook

MAX_PRIORITY = 100
# Float fields travel as float32; beyond these they are mistakes, not settings.
MAX_FPS = 1000.0
MAX_GUIDANCE_SCALE = 1000.0
MAX_QUALITY = 100  # output.quality is 1-100 (0 = the encoder's default)
# Webhook progress: more often than 10 times a second is a flood, not progress; an hour is the
# longest that still means something (0 = the default, 1000 ms).
MIN_PROGRESS_INTERVAL_MS = 100
MAX_PROGRESS_INTERVAL_MS = 3_600_000
WEBHOOK_URL = "webhook.url"
MAX_WEBHOOK_URL_CHARS = 2048  # what browsers and most proxies take
TEXT_TASKS = {Task.TEXT2IMAGE, Task.IMAGE2IMAGE, Task.INPAINT, Task.TEXT2VIDEO, Task.TEXT2AUDIO}
OUTPUT_KIND = {
    Task.TEXT2IMAGE: MediaKind.IMAGE,
    Task.IMAGE2IMAGE: MediaKind.IMAGE,
    Task.INPAINT: MediaKind.IMAGE,
    Task.TEXT2VIDEO: MediaKind.VIDEO,
    Task.IMAGE2VIDEO: MediaKind.VIDEO,
    Task.AUDIO2VIDEO: MediaKind.VIDEO,
    Task.TEXT2AUDIO: MediaKind.AUDIO,
}
FORMATS = {
    MediaKind.IMAGE: ("png", "webp", "jpeg"),
    MediaKind.VIDEO: ("mp4", "gif"),
    MediaKind.AUDIO: ("wav", "flac", "mp3", "pcm", "opus", "aac"),
}


@dataclass
class Plan:
    """A validated request: the model's spec and the request with every default applied."""

    spec: ModelSpec
    request: GenerateRequest
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _positive(req: GenerateRequest, name: str, limit: int) -> InvalidRequest | None:
    """The fault of an int field that is not positive, or over `limit` (0: none) or int32."""
    value = getattr(req, name)
    if value is None:
        return None
    if value <= 0:
        return bad(name, f"must be positive (got {value})")
    if limit and value > limit:
        return bad(name, f"at most {limit} for this model (got {value})")
    if value > INT32_MAX:  # the field is an int32 on the wire
        return bad(name, f"at most {INT32_MAX} (got {value})")
    return None


def _finite(req: GenerateRequest, name: str, low: float, high: float) -> InvalidRequest | None:
    """The fault of a float field outside `low..high` (NaN and infinities: they compare false)."""
    value = getattr(req, name)
    if value is not None and not (math.isfinite(value) and low <= value <= high):
        return bad(name, f"must be between {low:g} and {high:g} (got {value})")
    return None


def _check_times(req: GenerateRequest, now_ms: int, found: Violations) -> None:
    """Deadline and timeout: the job's deadline (now + timeout) must stay a sane int64."""
    if req.deadline_ms < 0 or (req.deadline_ms and req.deadline_ms <= now_ms):
        found.append(bad("deadline_ms", f"already past (deadline {req.deadline_ms}, now {now_ms})"))
    elif req.deadline_ms > now_ms + MAX_TIMEOUT_MS:
        reason = f"at most {MAX_TIMEOUT_MS} ms ahead (got {req.deadline_ms}, now {now_ms})"
        found.append(bad("deadline_ms", reason))
    if not 0 <= req.timeout_ms <= MAX_TIMEOUT_MS:
        found.append(bad("timeout_ms", f"must be between 0 and {MAX_TIMEOUT_MS} (got {req.timeout_ms})"))


def parse_webhook_url(url: str) -> SplitResult:
    """The URL's parts, or INVALID_ARGUMENT naming webhook.url: http(s), a host, bounded, no credentials."""
    if not url:
        raise bad(WEBHOOK_URL, "required (an http:// or https:// URL)")
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise bad(WEBHOOK_URL, f"at most {MAX_WEBHOOK_URL_CHARS} characters (got {len(url)})")
    if not (url.isascii() and url.isprintable()) or any(c.isspace() for c in url):
        raise bad(WEBHOOK_URL, f"must be printable ASCII without spaces (got {echo(url)})")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise bad(WEBHOOK_URL, f"not a URL ({exc}): {echo(url)}") from None
    if parts.scheme not in ("http", "https"):
        raise bad(WEBHOOK_URL, f"must be an http:// or https:// URL (got scheme {echo(parts.scheme)})")
    if not parts.hostname:
        raise bad(WEBHOOK_URL, f"names no host: {echo(url)}")
    if parts.username is not None or parts.password is not None:
        raise bad(WEBHOOK_URL, "must not carry a user name or password (the payload is signed instead)")
    if port == 0:
        raise bad(WEBHOOK_URL, "port 0 is no port")
    return parts


def _check_webhook(req: GenerateRequest) -> None:
    """The webhook's URL shape, events and progress interval (its addresses: `webhooks.addresses`,
    checked by the servicer at submission)."""
    hook = req.webhook
    if hook is None:
        return
    parse_webhook_url(hook.url)
    interval = hook.progress_interval_ms
    if interval and not MIN_PROGRESS_INTERVAL_MS <= interval <= MAX_PROGRESS_INTERVAL_MS:
        raise bad(
            "webhook.progress_interval_ms",
            f"must be 0 (1000) or between {MIN_PROGRESS_INTERVAL_MS} and {MAX_PROGRESS_INTERVAL_MS} "
            f"(got {interval})",
        )
    # Each event once (the order the client gave); the default interval made explicit.
    req.webhook = Webhook(
        url=hook.url, events=list(dict.fromkeys(hook.events)), progress_interval_ms=interval or 1000
    )


BALANCED = "balanced"  # every model has it: its own, else its defaults (the original's default preset)


def _preset(req: GenerateRequest, spec: ModelSpec) -> Preset | None:
    """The request's preset; its runtime options become the request's when it sets none."""
    if not req.preset:
        return None
    preset = next((p for p in spec.presets if p.name == req.preset), None)
    if preset is None and req.preset == BALANCED:
        return None  # a model that defines no "balanced" preset: its defaults are the balance
    if preset is None:
        names = ", ".join(p.name for p in spec.presets) or "none"
        raise bad("preset", f"unknown preset {echo(req.preset)} for {spec.id} (known: {names})")
    if PRESET_RUNTIME in preset.overrides and "runtime" not in req.extra:
        req.extra = {**req.extra, "runtime": dict(preset.overrides[PRESET_RUNTIME])}
    return preset


def _check_family(req: GenerateRequest, spec: ModelSpec, family: Family) -> None:
    """What the request itself asks (before defaults) that its model's family cannot honour."""
    if spec.execution_mode not in family.modes:
        raise FailedPrecondition(
            f"{spec.id} cannot run in {spec.execution_mode} mode: the {family.id} family runs in "
            f"{', '.join(family.modes)}",
            field="model",
        )
    assert req.task is not None
    if spec.execution_mode == ExecutionMode.MODULAR and req.task not in family.modular:
        runs = ", ".join(t.value for t in family.modular)
        raise FailedPrecondition(
            f"{spec.id} cannot run {req.task.value} in modular mode: the {family.id} family's modular "
            f"blocks run {runs}",
            field="task",
        )
    if spec.execution_mode == ExecutionMode.PERSISTENT_WORKER:
        _check_persistent(req, spec, family)
    given = {
        "prompt": bool(req.prompt.strip()),
        "negative_prompt": bool(req.negative_prompt.strip()),
        "guidance_scale": req.guidance_scale is not None,
        "num_frames": req.num_frames is not None,
        "duration_ms": req.duration_ms is not None,
        "num_inference_steps": req.num_inference_steps is not None,
        "width": req.width is not None,
        "height": req.height is not None,
    }
    for name in family.unsupported:
        if given.get(name):
            raise bad(name, f"{spec.id} takes no {name} (no pipeline of the {family.id} family has one)")
    allowed = {*REQUIRED_INPUTS.get(req.task, ()), *family.inputs.get(req.task, ())}
    for i, item in enumerate(req.inputs):
        if item.role not in allowed:
            takes = ", ".join(sorted(r.value for r in allowed)) or "no inputs"
            raise bad(
                f"inputs[{i}].role",
                f"{req.task.value} on {spec.id} takes no {item.role.value} input (it takes: {takes})",
            )


def _check_persistent(req: GenerateRequest, spec: ModelSpec, family: Family) -> None:
    """The resident group runs a parallel kind its family supports; its pipeline program (a
    `runtime.parallel`, or `runtime.program = "pipeline"`) also tasks with media inputs, the
    Stable Diffusion loops text-to-image only."""
    assert req.task is not None
    runtime = spec.runtime if isinstance(spec.runtime, dict) else {}
    pipeline = bool(runtime.get("parallel")) or runtime.get("program") == "pipeline"
    if REQUIRED_INPUTS.get(req.task) and not pipeline:
        reason = f"{spec.id} runs in persistent_worker mode, whose SD loop runs text-to-X tasks only"
        raise FailedPrecondition(f"{reason} (not {req.task.value}; runtime.parallel runs it)", field="task")
    kind = runtime.get("parallel")
    if kind and kind not in family.parallel:
        takes = ", ".join(family.parallel) or "none"
        reason = f"{spec.id}: runtime.parallel {kind!r} is not one the {family.id} family runs ({takes})"
        raise FailedPrecondition(reason, field="model")


def _check_grid(req: GenerateRequest, spec: ModelSpec, family: Family | None, found: Violations) -> None:
    """Width and height on the family's size grid; num_frames on its temporal grid."""
    lim = spec.limits
    multiple, where = (family.size_multiple, f" for the {family.id} family") if family else (8, "")
    for name, limit in (("width", lim.max_width), ("height", lim.max_height)):
        value = getattr(req, name)
        if value is not None and value > 0 and value % multiple:
            found.append(bad(name, f"must be a multiple of {multiple}{where} (got {value})"))
        elif fault := _positive(req, name, limit):
            found.append(fault)
    steps = req.num_inference_steps
    if family is not None and steps is not None and 0 < steps < family.min_steps:
        reason = f"at least {family.min_steps} for the {family.id} family (got {steps})"
        found.append(bad("num_inference_steps", reason))
    frames = req.num_frames
    if family is not None and frames is not None and frames > 0 and not family.on_frame_grid(frames):
        k = family.frame_grid
        grid = f"1, {k + 1}, {2 * k + 1}, ..."
        found.append(bad("num_frames", f"must be {k}k+1 for the {family.id} family ({grid}; got {frames})"))


def _check_inputs(req: GenerateRequest, task: Task) -> None:
    roles = []
    for i, item in enumerate(req.inputs):
        if item.role is None:
            raise bad(f"inputs[{i}].role", "required")
        if not item.data and not item.uri:
            raise bad(f"inputs[{i}]", "needs data or uri")
        roles.append(item.role)
    for role in REQUIRED_INPUTS.get(task, ()):
        if role not in roles:
            raise bad("inputs", f"{task.value} needs an input with role {role.value}")


NULL_FAMILY = "null"  # the null model: no pipeline, no compute (docs/catalog.md)


def _check_step_cache(req: GenerateRequest, spec: ModelSpec, family: Family | None) -> None:
    """A step cache asked of a family whose denoiser takes no cache hooks (a UNet, SD3's MMDiT)."""
    runtime = req.extra.get("runtime")
    if family is None or family.step_cache or not isinstance(runtime, dict) or not runtime.get("step_cache"):
        return
    reason = f"the {family.id} family's denoiser takes no diffusers cache hooks ({spec.id})"
    raise bad("extra.runtime.step_cache", reason)


def _check_runtime(req: GenerateRequest, spec: ModelSpec, family: Family | None) -> None:
    """Validate and normalize `extra.runtime` (runtime options per request; legacy_call models
    only), then its step cache against the family."""
    if "runtime" not in req.extra:
        return
    if spec.execution_mode != ExecutionMode.LEGACY_CALL:
        reason = f"{spec.id} runs in {spec.execution_mode} mode, which takes no runtime options per request"
        raise bad("extra.runtime", reason)
    if spec.family == NULL_FAMILY:  # its worker would refuse it, after the queue
        raise bad("extra.runtime", f"{spec.id} runs no pipeline: it takes no runtime options")
    try:
        options = runtime_schema.request_options(req.extra["runtime"], spec.runtime)
    except runtime_schema.RuntimeOptionError as exc:
        raise bad(f"extra.runtime.{exc.path}".rstrip("."), exc.reason) from None
    # Normalized, so equal settings batch together (`extra` is part of the batching key).
    req.extra = {**req.extra, "runtime": options}
    _check_step_cache(req, spec, family)


def validate(request: GenerateRequest, catalog: Catalog, *, now_ms: int | None = None) -> Plan:
    """Check `request` against the catalog and fill in every default.

    Raises InvalidRequest naming every field at fault that one pass finds (`bounds.Violations`:
    the first as `field`, all in `violations`); a check that needs an earlier one's value to be
    good (anything after the sizes, the task or the preset) runs only when it is. Another
    error (an unknown model, a mode the family cannot run) is raised as it comes, unless a field
    was found at fault before it.
    """
    found = Violations()
    try:
        return _validate(request, catalog, now_ms, found)
    except OmniRTError:
        found.stop()  # what was found first is what the caller hears first
        raise


def _validate(request: GenerateRequest, catalog: Catalog, now_ms: int | None, found: Violations) -> Plan:
    req = dataclasses.replace(request)
    spec = catalog.resolve(req.model)
    req.model = spec.id
    if spec.streaming:
        raise FailedPrecondition(
            f"{spec.id} is a streaming model: it runs realtime sessions (RealtimeService.Session, "
            "WS /v1/avatar/realtime), not jobs",
            field="model",
        )
    # Sizes first: nothing below walks or quotes an unbounded value.
    bounds.check_request(req, spec.limits, found)
    _check_times(req, int(time.time() * 1000) if now_ms is None else now_ms, found)
    found.run(_check_webhook, req)
    req.task = defaults.task_of(req, spec)
    if req.task not in spec.tasks:
        tasks = ", ".join(t.value for t in spec.tasks)
        # Every check below needs a task the model does.
        found.stop(bad("task", f"{spec.id} does not do {req.task.value} (it does: {tasks})"))
    if req.task in TEXT_TASKS and not req.prompt.strip():
        found.append(bad("prompt", f"required for {req.task.value}"))
    if not 0 <= req.priority <= MAX_PRIORITY:
        found.append(bad("priority", f"must be between 0 and {MAX_PRIORITY} (got {req.priority})"))
    found.run(_check_inputs, req, req.task)
    family = catalog.family(spec)
    if family is not None:
        found.run(_check_family, req, spec, family)
    try:
        preset = _preset(req, spec)
    except InvalidRequest as fault:
        found.stop(fault)  # the defaults below depend on the preset
        raise
    found.run(_check_runtime, req, spec, family)
    defaults.apply(req, spec, preset.overrides if preset else None)
    _check_values(req, spec, family, found)
    found.stop()
    return Plan(spec=spec, request=req, config=resolved_config(req, spec))


def _check_values(req: GenerateRequest, spec: ModelSpec, family: Family | None, found: Violations) -> None:
    """The request's numbers and output format, with its defaults applied: each field's fault
    to `found`."""
    lim = spec.limits
    _check_grid(req, spec, family, found)
    for name, limit in (
        ("num_inference_steps", lim.max_inference_steps),
        ("num_outputs", lim.max_num_outputs),
        ("num_frames", lim.max_num_frames),
        ("duration_ms", lim.max_duration_ms),
    ):
        if fault := _positive(req, name, limit):
            found.append(fault)
    if req.guidance_scale is not None and req.guidance_scale < 0:
        found.append(bad("guidance_scale", f"must not be negative (got {req.guidance_scale})"))
    elif fault := _finite(req, "guidance_scale", 0, MAX_GUIDANCE_SCALE):
        found.append(fault)
    if req.strength is not None and not 0 < req.strength <= 1:
        found.append(bad("strength", f"must be in (0, 1] (got {req.strength})"))
    elif req.strength is not None and req.num_inference_steps and planned_steps(req) < 1:
        # diffusers runs int(steps * strength) of them: none would fail inside the pipeline.
        reason = (
            f"{req.strength:g} of {req.num_inference_steps} step(s) is no denoising step; "
            "raise strength or num_inference_steps"
        )
        found.append(bad("strength", reason))
    if req.fps is not None and req.fps <= 0:
        found.append(bad("fps", f"must be positive (got {req.fps})"))
    elif fault := _finite(req, "fps", 0, MAX_FPS):
        found.append(fault)
    if not 0 <= req.quality <= MAX_QUALITY:
        found.append(bad("output.quality", f"must be between 0 and {MAX_QUALITY} (got {req.quality})"))
    if not 0 <= req.inline_limit_bytes <= bounds.INT64_MAX:
        reason = f"must be between 0 and 2**63-1 (got {req.inline_limit_bytes})"
        found.append(bad("output.inline_limit_bytes", reason))
    assert req.seed is not None and req.task is not None  # defaults.apply chose a seed
    if not 0 <= req.seed <= MAX_SEED:
        found.append(bad("seed", f"must be between 0 and {MAX_SEED} (got {req.seed})"))
    kind = OUTPUT_KIND[req.task]
    req.output_format = (req.output_format or FORMATS[kind][0]).lower()
    if req.output_format not in FORMATS[kind]:
        reason = f"{echo(req.output_format)} is not one of {', '.join(FORMATS[kind])}"
        found.append(bad("output.format", reason))


def resolved_config(req: GenerateRequest, spec: ModelSpec) -> dict[str, Any]:
    """The settings a worker will run with, as shown by Validate and the RunReport."""
    keys = (
        "width",
        "height",
        "num_frames",
        "fps",
        "duration_ms",
        "num_inference_steps",
        "guidance_scale",
        "strength",
    )
    config: dict[str, Any] = {k: getattr(req, k) for k in keys if getattr(req, k) is not None}
    config.update(
        model=spec.id,
        task=req.task.value if req.task else "",
        execution_mode=spec.execution_mode,
        source=spec.source,
        pipeline_class=spec.pipeline_class,
        seed=req.seed,
        num_outputs=req.num_outputs,
        output_format=req.output_format,
    )
    if req.scheduler:
        config["scheduler"] = req.scheduler
    if req.preset:
        config["preset"] = req.preset
    if req.extra:
        config["extra"] = req.extra
    return config
