"""The original OmniRT's request and result shapes, translated once for every surface.

The original (datascale-ai/omnirt) takes `{"task", "model", "backend", "inputs": {...},
"config": {...}, "adapters": [...]}` and answers `{"outputs": [...], "metadata": {...}}`
(its Service Schema, `schema_version` 1.0.0). The HTTP edge (`POST /v1/generate` in that shape),
the SDK (`omnirt.generate(dict | path)`, `omnirt.requests`) and the CLI (`--config FILE`) all
come through here, so the three agree on every key (docs/migrating.md).

What the original sets per request but OmniRT decides elsewhere (weights, devices, dtypes,
output folders: the catalog and the workers') is refused naming `config.<key>`, with where it
lives now, rather than silently ignored.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from omnirt import errors
from omnirt.types import (
    Adapter,
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobEvent,
    JobState,
    MediaInput,
    MediaRole,
    Task,
)

SCHEMA_VERSION = "1.0.0"
# The original's backends -> a worker's backend ("" = any, the scheduler's choice).
BACKENDS = {"auto": "", "cuda": "cuda", "ascend": "ascend", "cpu-stub": "cpu"}
# Its tasks -> ours ("edit" is an image-to-image of an edit model: Qwen-Image-Edit, Kontext).
TASKS = {task.value: task for task in Task} | {"edit": Task.IMAGE2IMAGE}
# The keys only the original's shape has (ours has none of them at the top, or not as objects).
MARKERS = ("config", "backend", "async_run")
# The label a job made from the original's shape carries (labels persist in every job store), so
# the HTTP gateway answers for it in that shape wherever it is read.
SHAPE_LABEL = "omnirt.shape"
SHAPE_ORIGINAL = "original"
# The label that pins a job to the workers of one backend (`cpu`, `cuda`, `ascend`): the
# original's `backend` sets it, and any client may (docs/controller.md, "Routing by backend").
BACKEND_LABEL = "omnirt.backend"
PINNED_BACKENDS = ("cpu", "cuda", "ascend")

# Our own request's fields (a body with `inputs` as an object and one of these is refused as ours).
OUR_FIELDS = frozenset(f.name for f in dataclasses.fields(GenerateRequest))
# config keys that are request fields here (the original's name -> ours).
CONFIG_FIELDS = {
    "preset": "preset",
    "width": "width",
    "height": "height",
    "num_inference_steps": "num_inference_steps",
    "guidance_scale": "guidance_scale",
    "seed": "seed",
    "scheduler": "scheduler",
    "num_frames": "num_frames",
    "fps": "fps",
    "strength": "strength",
    "negative_prompt": "negative_prompt",
    "num_images_per_prompt": "num_outputs",
    "output_format": "output_format",
}
# config keys that are runtime options here (`extra.runtime`), with how the value maps.
CONFIG_RUNTIME: dict[str, Callable[[Any], tuple[str, Any]]] = {
    "enable_vae_slicing": lambda v: ("enable_vae_slicing", v),
    "enable_vae_tiling": lambda v: ("enable_vae_tiling", v),
    "enable_model_cpu_offload": lambda v: ("cpu_offload", "model" if v else None),
    "enable_sequential_cpu_offload": lambda v: ("cpu_offload", "sequential" if v else None),
    "cpu_offload": lambda v: ("cpu_offload", v),
}
# config keys that are the pipeline's own call arguments: they go as `extra` (the worker checks
# each against the pipeline's signature and types, naming `extra.<key>`).
CONFIG_PIPELINE = frozenset(
    {
        "max_sequence_length",
        "guidance_rescale",
        "guidance_scale_2",
        "true_cfg_scale",
        "eta",
        "clip_skip",
        "noise_aug_strength",
        "motion_bucket_id",
        "decode_chunk_size",
    }
)
# config keys that OmniRT sets elsewhere: where, for the error.
CONFIG_ELSEWHERE = {
    "model_path": "a catalog entry's `source` (docs/catalog.md)",
    "repo_path": "a catalog entry's `source` (docs/catalog.md)",
    "dtype": "the catalog entry's `dtype` (docs/catalog.md)",
    "device": "the worker's --backend and --devices (docs/worker.md)",
    "devices": "the worker's --devices (docs/worker.md)",
    "device_map": "the catalog entry's runtime table (docs/catalog.md)",
    "visible_devices": "the worker's --devices (docs/worker.md)",
    "output_dir": "the client: results come back to it (`omnirt save`, `--out`)",
    "quantization": "the catalog entry's runtime `quantization` table (docs/catalog.md)",
}
# inputs keys -> (a request field, or a media role).
INPUT_FIELDS = {
    "prompt": "prompt",
    "negative_prompt": "negative_prompt",
    "num_frames": "num_frames",
    "fps": "fps",
}
INPUT_MEDIA = {
    "image": MediaRole.IMAGE,
    "mask": MediaRole.MASK,
    "audio": MediaRole.AUDIO,
    "video": MediaRole.VIDEO,
}
# Our request fields' JSON types, as the proto holds them (the others are text): a value of
# another type is refused naming the original's key, not failed in the proto.
INT32_FIELDS = frozenset({"width", "height", "num_frames", "num_inference_steps", "num_outputs"})
FLOAT32_FIELDS = frozenset({"fps", "guidance_scale", "strength"})
INT32_MAX, INT64_MAX, FLOAT32_MAX = 2**31 - 1, 2**63 - 1, 3.4028234663852886e38

# How a string input becomes a MediaInput: the SDK reads a local path, the HTTP edge leaves a
# path for the worker to read (`file://`, under its --input-root).
MediaReader = Callable[[MediaRole, Any, str], MediaInput]


def is_original(body: Mapping[str, Any]) -> bool:
    """Whether a JSON body is in the original's shape.

    It has a field only that shape has: `inputs` as an object, `config`, `backend` or `async_run`.
    """
    return isinstance(body.get("inputs"), dict) or any(key in body for key in MARKERS)


def remote_media(role: MediaRole, value: Any, field: str) -> MediaInput:
    """An input as a server receives it.

    A `data:` URL or base64 text is the bytes, a URL (`https://`, `s3://`, `file://`) is fetched
    by the worker, and an absolute path is a file on the worker's side (`file://PATH`, which it
    reads only under its --input-root).
    """
    if not isinstance(value, str) or not value:
        raise errors.InvalidRequest(f"{field}: a path, a URL or base64 data", field=field)
    if value.startswith("data:"):
        _, _, encoded = value.partition(",")
        return MediaInput(role=role, data=_b64(encoded, field))
    if "://" in value:
        return MediaInput(role=role, uri=value)
    if value.startswith("/"):
        return MediaInput(role=role, uri="file://" + value)
    if len(value) > 256:  # longer than any path a person writes: the bytes themselves
        return MediaInput(role=role, data=_b64(value, field))
    raise errors.InvalidRequest(
        f"{field}: a relative path means nothing to a server; give an absolute path on the worker, "
        "a URL or a data: URL",
        field=field,
    )


def _b64(text: str, field: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise errors.InvalidRequest(f"{field}: not valid base64", field=field) from None


def request_from_original(
    payload: Mapping[str, Any], media: MediaReader = remote_media
) -> tuple[GenerateRequest, str]:
    """Our request, and the worker backend asked for ("" = any), from the original's request.

    InvalidRequest names the original's field (`config.model_path`, `inputs.image`).
    """
    if not isinstance(payload, Mapping):
        raise errors.InvalidRequest("the request must be an object", field="")
    unknown = sorted(set(payload) - {"task", "model", "backend", "inputs", "config", "adapters", "async_run"})
    ours = [key for key in unknown if key in OUR_FIELDS]
    if ours and not any(key in payload for key in MARKERS):
        # Only `inputs` as an object made it the original's: more likely our request, mistaken.
        raise errors.InvalidRequest(
            f"inputs: an object is the original OmniRT's request shape, which has no {ours[0]!r} at the "
            "top (it takes inputs.prompt, config.width, ...); OmniRT's own takes inputs as a list of "
            "{role, data or uri}",
            field="inputs",
        )
    if unknown:
        raise errors.InvalidRequest(f"{unknown[0]}: not a field of the request", field=unknown[0])
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise errors.InvalidRequest("model: required (a model id)", field="model")
    req = GenerateRequest(model=model)
    task = payload.get("task")
    if task is not None:
        if not isinstance(task, str) or task not in TASKS:
            known = ", ".join(sorted(TASKS))
            raise errors.InvalidRequest(
                f"task: {_shown(task)} is not offered here (known: {known})", field="task"
            )
        req.task = TASKS[task]
    backend = payload.get("backend", "auto")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise errors.InvalidRequest(
            f"backend: {_shown(backend)} is not one of {', '.join(BACKENDS)}", field="backend"
        )
    _inputs(req, _object(payload.get("inputs"), "inputs"), media)
    _config(req, _object(payload.get("config"), "config"))
    _adapters(req, payload.get("adapters"))
    if BACKENDS[backend]:
        req.labels[BACKEND_LABEL] = BACKENDS[backend]
    return req, BACKENDS[backend]


def _object(value: Any, field: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise errors.InvalidRequest(f"{field}: must be an object", field=field)
    return value


def _inputs(req: GenerateRequest, inputs: Mapping[str, Any], media: MediaReader) -> None:
    for key, value in inputs.items():
        field = f"inputs.{key}"
        if key in INPUT_FIELDS and value is None:
            continue  # unset, as the original took None
        if key in INPUT_FIELDS:
            setattr(req, INPUT_FIELDS[key], _typed(INPUT_FIELDS[key], value, field))
        elif key in INPUT_MEDIA and isinstance(value, list):
            # The original's `edit` takes several images (multi-image edit models): one input each.
            for index, item in enumerate(value):
                req.inputs.append(media(INPUT_MEDIA[key], item, f"{field}[{index}]"))
        elif key in INPUT_MEDIA:
            req.inputs.append(media(INPUT_MEDIA[key], value, field))
        else:
            known = ", ".join(sorted([*INPUT_FIELDS, *INPUT_MEDIA]))
            raise errors.InvalidRequest(f"{field}: not an input OmniRT takes (known: {known})", field=field)


def _config(req: GenerateRequest, config: Mapping[str, Any]) -> None:
    runtime: dict[str, Any] = {}
    for key, value in config.items():
        field = f"config.{key}"
        if (key in CONFIG_FIELDS and value is None) or (key == "seed" and value == "random"):
            continue  # unset, as the original took None; its seed "random": drawn by the controller
        if key in CONFIG_FIELDS:
            setattr(req, CONFIG_FIELDS[key], _typed(CONFIG_FIELDS[key], value, field))
        elif key in CONFIG_RUNTIME:
            name, mapped = CONFIG_RUNTIME[key](value)
            if mapped is not None:
                runtime[name] = mapped
        elif key in CONFIG_PIPELINE:
            req.extra[key] = value
        elif key in CONFIG_ELSEWHERE:
            raise errors.InvalidRequest(
                f"{field}: not set per request in OmniRT; it is {CONFIG_ELSEWHERE[key]}", field=field
            )
        else:
            raise errors.InvalidRequest(
                f"{field}: not a setting OmniRT knows (docs/migrating.md)", field=field
            )
    if runtime:
        req.extra["runtime"] = runtime


def _adapters(req: GenerateRequest, adapters: Any) -> None:
    if adapters is None:
        return
    if not isinstance(adapters, list):
        raise errors.InvalidRequest("adapters: a list of {kind, path, scale}", field="adapters")
    for index, item in enumerate(adapters):
        field = f"adapters[{index}]"
        if not isinstance(item, Mapping) or item.get("kind", "lora") != "lora" or not item.get("path"):
            raise errors.InvalidRequest(f"{field}: a {{kind: lora, path, scale}} object", field=field)
        path = str(item["path"])
        if "/" in path or path.startswith("hf:"):
            raise errors.InvalidRequest(
                f"{field}.path: adapters are the catalog's here, by name (not {_shown(path)}): add it to the "
                "catalog's adapters (docs/catalog.md) and give its name",
                field=f"{field}.path",
            )
        scale = _typed("scale", item.get("scale", 1.0), f"{field}.scale")
        req.adapters.append(Adapter(name=path, scale=scale))


def _typed(name: str, value: Any, field: str) -> Any:
    """`value` for our request field `name` (or an adapter's `scale`), as the proto holds it.

    A value of another type or out of its range is InvalidRequest naming `field`.
    """
    if name in INT32_FIELDS or name == "seed":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        top = INT64_MAX if name == "seed" else INT32_MAX
        if isinstance(value, bool) or not isinstance(value, int) or not -top - 1 <= value <= top:
            kind = "a 64-bit" if name == "seed" else "a 32-bit"
            raise errors.InvalidRequest(f"{field}: must be {kind} integer (got {_shown(value)})", field=field)
        return value
    if name in FLOAT32_FIELDS or name == "scale":
        number = math.nan
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value) if abs(value) <= FLOAT32_MAX else math.inf  # no OverflowError
        if not math.isfinite(number):
            message = f"{field}: must be a finite number within float32 range (got {_shown(value)})"
            raise errors.InvalidRequest(message, field=field)
        return number
    if not isinstance(value, str):
        raise errors.InvalidRequest(f"{field}: must be a string (got {_shown(value)})", field=field)
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def field_to_original(field: str, payload: Mapping[str, Any]) -> str:
    """Our request's field at fault (the controller's or a worker's error) as `payload`'s path.

    `width` -> `config.width`, `extra.runtime.enable_vae_tiling` -> `config.enable_vae_tiling`,
    `inputs[1].data` -> `inputs.mask`: where the original's request gave it; others as they are.
    """
    if field == f'labels["{BACKEND_LABEL}"]':  # the label its `backend` set
        return "backend"
    head, sep, rest = field.partition(".")
    name, bracket, index = head.partition("[")
    config, inputs = (_object_or_empty(payload.get(key)) for key in ("config", "inputs"))
    if name == "inputs" and bracket:  # our media list, in the order the original's keys made it
        media = [
            f"inputs.{key}[{i}]" if isinstance(value, list) else f"inputs.{key}"
            for key, value in inputs.items()
            if key in INPUT_MEDIA
            for i in range(len(value) if isinstance(value, list) else 1)
        ]
        position = index.rstrip("]")
        return media[int(position)] if position.isdigit() and int(position) < len(media) else field
    if name == "extra" and not bracket and rest:
        key, _, deeper = rest.partition(".")
        if key == "runtime" and deeper:
            option = deeper.partition(".")[0]
            for original in config:
                if original in CONFIG_RUNTIME and CONFIG_RUNTIME[original](True)[0] == option:
                    return f"config.{original}" + deeper[len(option) :]
        return f"config.{rest}" if key in config else field
    for where, table in (("inputs", INPUT_FIELDS), ("config", CONFIG_FIELDS)):
        source = inputs if where == "inputs" else config
        for original, ours in table.items():
            if ours == name and original in source:
                return f"{where}.{original}{head[len(name) :]}{sep}{rest}"
    return field


def _object_or_empty(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def error_to_original(error: errors.OmniRTError, payload: Mapping[str, Any]) -> errors.OmniRTError:
    """`error` with its fields (and the messages that begin with them) as `payload`'s paths."""

    def moved(field: str, text: str) -> tuple[str, str]:
        path = field_to_original(field, payload) if field else field
        if path != field and text.startswith(field + ":"):
            text = path + text[len(field) :]
        return path, text

    if error.field:
        error.field, error.message = moved(error.field, error.message)
        error.args = (error.message,)
    error.violations = [moved(field, text) for field, text in error.violations]
    return error


# ---- answers -------------------------------------------------------------------------------


def output_of(artifact: Any, url: str) -> dict[str, Any]:
    """One of the original's `outputs`.

    Where it gave a server path, `path` and `url` are a URL the client can GET.
    """
    kind = artifact.kind.value if hasattr(artifact.kind, "value") else str(artifact.kind)
    return {
        "kind": kind,
        "path": url,
        "url": url,
        "mime": artifact.mime_type,
        "width": artifact.width or None,
        "height": artifact.height or None,
        "num_frames": artifact.num_frames or None,
    }


def result_to_original(
    result: GenerateResult, url_of: Callable[[Any], str], backend: str = ""
) -> dict[str, Any]:
    """Our result in the original's shape: `outputs` and `metadata` (timings in seconds)."""
    report = result.report
    timings = {t.name: round(t.duration_ms / 1000, 6) for t in report.timings}
    metadata: dict[str, Any] = {
        "run_id": result.job_id,
        "job_id": result.job_id,
        "task": report.task.value if report.task else "",
        "model": report.model,
        "backend": report.backend or backend,
        "trace_id": report.trace_id,
        "worker_id": report.worker_id,
        "execution_mode": report.execution_mode,
        "queue_wait_ms": report.queue_wait_ms,
        "timings": timings,
        "memory": {"peak_bytes": report.peak_memory_bytes} if report.peak_memory_bytes else {},
        "config_resolved": dict(report.config_resolved),
        "cache_hits": [],
        "device_placement": {},
        "batch_size": report.batch_size or 1,
        "stream_events": [],
        "error": None,
        "schema_version": SCHEMA_VERSION,
    }
    return {"outputs": [output_of(a, url_of(a)) for a in result.artifacts], "metadata": metadata}


def job_to_original(
    job: Job, url_of: Callable[[Any], str], request: Mapping[str, Any] | None = None, trace_id: str = ""
) -> dict[str, Any]:
    """A job in the original's shape: `{id, state, trace_id, ...}`, lowercase states.

    Once it succeeded, its `result` (whose metadata has the `job_id`); `request` is the original
    request it came as, when known.
    """
    state = job.state.value if isinstance(job.state, JobState) else str(job.state)
    record: dict[str, Any] = {
        "id": job.id,
        "state": state,
        "trace_id": trace_id or (job.result.report.trace_id if job.result else ""),
        "backend": job.result.report.backend if job.result else "",
        "worker_id": job.worker_id or None,
        "error": job.error.message if job.error else None,
        "enqueued_at_ms": _ms(job.created_at),
        "started_at_ms": _ms(job.started_at),
        "finished_at_ms": _ms(job.finished_at),
    }
    if request is not None:
        record["request"] = dict(request)
    if job.result is not None:
        record["result"] = result_to_original(job.result, url_of)
        record["execution_mode"] = job.result.report.execution_mode
    return record


def _ms(when: Any) -> int | None:
    return int(when.timestamp() * 1000) if when is not None else None


# ---- events and traces ---------------------------------------------------------------------

# Our state events as the original's job events (its engine's names).
STATE_EVENTS = {
    JobState.QUEUED: "job_enqueued",
    JobState.RUNNING: "job_started",
    JobState.SUCCEEDED: "job_finished",
    JobState.FAILED: "job_failed",
    JobState.CANCELLED: "job_cancelled",
}


def event_to_original(event: JobEvent) -> dict[str, Any] | None:
    """One of our job events as the original's `{event, stage, timestamp_ms, data}`.

    None for what it had no event for: previews, and the result (the job's record has it).
    """
    data: dict[str, Any] = {"job_id": event.job_id}
    if event.kind is EventKind.STATE and event.state is not None:
        name, stage = STATE_EVENTS.get(event.state, f"job_{event.state.value}"), "job"
        if event.worker_id:
            data["worker_id"] = event.worker_id
        if event.error is not None:
            data["error"] = event.error.message
    elif event.kind is EventKind.STAGE:
        name, stage = ("stage_end" if event.stage_finished else "stage_start"), event.stage
        if event.stage_finished:
            data["duration_ms"] = event.stage_duration_ms
    elif event.kind is EventKind.PROGRESS and event.progress is not None:
        name, stage = "stage_progress", event.progress.stage or "denoise"
        data.update(step=event.progress.step, total_steps=event.progress.total_steps)
    elif event.kind is EventKind.LOG:
        name, stage = "log", "worker"
        data.update(stream=event.log_stream, text=event.log_text)
    else:
        return None
    return {"event": name, "stage": stage, "timestamp_ms": _ms(event.time) or 0, "data": data}


def trace_to_original(job: Job, events: Iterable[JobEvent], trace_id: str = "") -> dict[str, Any]:
    """A job's trace as the original's `GET /v1/jobs/{id}/trace` answered it.

    Its events, and one span per stage: the queue wait, then the worker's stage timings once
    the job has its result.
    """
    report = job.result.report if job.result is not None else None
    spans: list[dict[str, Any]] = []
    created, started = _ms(job.created_at), _ms(job.started_at)
    if created is not None and started is not None:
        spans.append(_span(len(spans), "queue", created, started))
    run_start = _ms(report.started_at) if report is not None else None
    if report is not None and run_start is not None:
        for timing in report.timings:
            begin = run_start + int(timing.start_offset_ms)
            spans.append(_span(len(spans), timing.name, begin, begin + int(timing.duration_ms)))
    state = job.state.value if isinstance(job.state, JobState) else str(job.state)
    return {
        "trace_id": trace_id or (report.trace_id if report is not None else ""),
        "job_id": job.id,
        "task": job.task.value if job.task else "",
        "model": job.model,
        "created_at_ms": created,
        "worker_id": job.worker_id or None,
        "state": state,
        "error": job.error.message if job.error else None,
        "events": [e for e in map(event_to_original, events) if e is not None],
        "spans": spans,
    }


def _span(index: int, stage: str, started_ms: int, ended_ms: int) -> dict[str, Any]:
    return {
        "span_id": f"{index:016x}",
        "name": stage,
        "stage": stage,
        "started_at_ms": started_ms,
        "ended_at_ms": ended_ms,
        "status": "ok",
        "attributes": {},
    }
