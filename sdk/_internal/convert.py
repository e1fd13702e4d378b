"""The one place that maps `omnirt.v1` protobuf messages to `omnirt.types` and back.

The SDK, the controller and the worker all translate through these functions; nothing else
reads or builds public protobuf messages field by field.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from omnirt import types as t
from omnirt.v1 import types_pb2

# ---- enums -------------------------------------------------------------------------------


# Number <-> member tables per (proto enum, Python enum), made on first use: every message
# converts a few enums, and the descriptor lookups by name cost more than the rest of it.
_FROM_PROTO: dict[tuple[str, Any], dict[int, Any]] = {}
_TO_PROTO: dict[tuple[str, Any], dict[Any, int]] = {}


def _tables(enum_type: Any, prefix: str, py_enum: Any) -> tuple[dict[int, Any], dict[Any, int]]:
    key = (enum_type.DESCRIPTOR.full_name, py_enum)
    if key not in _FROM_PROTO:
        members = {name.removeprefix(prefix): number for name, number in enum_type.items()}
        both = {m: members[m.name] for m in py_enum if m.name in members}
        _TO_PROTO[key] = both
        _FROM_PROTO[key] = {number: m for m, number in both.items() if number}
    return _FROM_PROTO[key], _TO_PROTO[key]


# Enum numbers are typed Any: the generated stubs give each enum its own ValueType.
def task_to_proto(task: t.Task | str | None) -> Any:
    """`Task` -> `omnirt.v1.Task` number (0 for None)."""
    if not task:
        return types_pb2.TASK_UNSPECIFIED
    number = _tables(types_pb2.Task, "TASK_", t.Task)[1].get(task)
    return number if number is not None else types_pb2.Task.Value("TASK_" + t.Task(task).name)


def task_from_proto(value: int) -> t.Task | None:
    """`omnirt.v1.Task` number -> `Task` (None when unspecified or unknown to this SDK)."""
    task: t.Task | None = _tables(types_pb2.Task, "TASK_", t.Task)[0].get(value)
    if task is not None:
        return task
    name = types_pb2.Task.Name(value) if value in types_pb2.Task.values() else ""
    return t.Task[name.removeprefix("TASK_")] if name and value else None


def enum_to_proto(enum_type: Any, prefix: str, value: Any) -> Any:
    """A Python enum member -> its number in `enum_type` (names `PREFIX` + the member's name)."""
    if not value:
        return 0
    number = _tables(enum_type, prefix, type(value))[1].get(value)
    return number if number is not None else int(enum_type.Value(prefix + value.name))


def enum_from_proto(enum_type: Any, prefix: str, py_enum: Any, value: int) -> Any:
    """A number of `enum_type` -> the member of `py_enum` (None for 0 or a number it lacks)."""
    member = _tables(enum_type, prefix, py_enum)[0].get(value)
    if member is not None:
        return member
    if not value or value not in enum_type.values():
        return None
    return py_enum[enum_type.Name(value).removeprefix(prefix)]


def state_to_proto(state: t.JobState | None) -> Any:
    return enum_to_proto(types_pb2.JobState, "JOB_STATE_", state)


def state_from_proto(value: int) -> t.JobState | None:
    return enum_from_proto(types_pb2.JobState, "JOB_STATE_", t.JobState, value)


# ---- small helpers -----------------------------------------------------------------------


def struct_from_dict(data: dict[str, Any] | None) -> struct_pb2.Struct:
    msg = struct_pb2.Struct()
    if data:
        msg.update(data)
    return msg


def _from_value(value: struct_pb2.Value, finite: bool) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        number = value.number_value
        if finite and (math.isinf(number) or math.isnan(number)):
            return json_format.MessageToDict(value)  # raises, with protobuf's message
        return number
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: _from_value(v, finite) for k, v in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_from_value(v, finite) for v in value.list_value.values]
    return None


def integral(data: Any) -> Any:
    """JSON-like `data` with each float that holds an integer made an int (`64.0` -> `64`).

    A Struct carries every number as a double, so a report's `"width": 64` comes back as 64.0;
    what people read (reports, HTTP answers, `--json`) shows it as written. Not for a request's
    `extra`, whose values reach a pipeline as given.
    """
    if isinstance(data, float):
        return int(data) if data.is_integer() else data
    if isinstance(data, dict):
        return {k: integral(v) for k, v in data.items()}
    if isinstance(data, list):
        return [integral(v) for v in data]
    return data


def dict_from_struct(msg: struct_pb2.Struct, *, finite: bool = True) -> dict[str, Any]:
    """The Struct as plain data, as `json_format.MessageToDict` gives it (numbers are floats).

    `finite=False` keeps NaN and infinities instead of raising (a request's `extra`: the
    controller's validation refuses them naming the field, not a ValueError naming nothing).
    """
    return {k: _from_value(v, finite) for k, v in msg.fields.items()}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The range of google.protobuf.Timestamp: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z.
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799


def ts_to_proto(value: datetime | None, target: timestamp_pb2.Timestamp) -> None:
    if value is None:
        return
    if value.tzinfo is None:
        value = value.astimezone(UTC)  # naive: local time
    # Integer arithmetic on the timedelta: exact, and cheaper than FromDatetime's timegm.
    delta = value - _EPOCH
    seconds = delta.days * 86400 + delta.seconds
    if not _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        target.FromDatetime(value.astimezone(UTC))  # raises, with protobuf's message
        return
    target.seconds = seconds
    target.nanos = delta.microseconds * 1000


def ts_from_proto(msg: Any, name: str) -> datetime | None:
    if not msg.HasField(name):
        return None
    ts = getattr(msg, name)
    seconds, nanos = ts.seconds, ts.nanos
    if 0 <= nanos < 1_000_000_000 and _MIN_SECONDS <= seconds <= _MAX_SECONDS:
        return _EPOCH + timedelta(seconds=seconds, microseconds=nanos // 1000)
    return ts.ToDatetime(tzinfo=UTC)  # raises for an invalid timestamp


def _opt(msg: Any, name: str) -> Any:
    return getattr(msg, name) if msg.HasField(name) else None


def _set_opt(msg: Any, name: str, value: Any) -> None:
    if value is not None:
        setattr(msg, name, value)


# ---- requests ----------------------------------------------------------------------------

_OPTIONAL_REQUEST_FIELDS = (
    "width",
    "height",
    "num_frames",
    "fps",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "num_outputs",
    "strength",
    "duration_ms",
)


def request_to_proto(req: t.GenerateRequest) -> types_pb2.GenerateRequest:
    msg = types_pb2.GenerateRequest(
        task=task_to_proto(req.task),
        model=req.model,
        prompt=req.prompt,
        negative_prompt=req.negative_prompt,
        scheduler=req.scheduler,
        preset=req.preset,
        priority=req.priority,
        deadline_ms=req.deadline_ms,
        timeout_ms=req.timeout_ms,
        idempotency_key=req.idempotency_key,
        labels=req.labels,
        output=types_pb2.OutputOptions(
            format=req.output_format, inline_limit_bytes=req.inline_limit_bytes, quality=req.quality
        ),
    )
    for name in _OPTIONAL_REQUEST_FIELDS:
        _set_opt(msg, name, getattr(req, name))
    for item in req.inputs:
        media_to_proto(item, msg.inputs.add())
    for adapter in req.adapters:
        msg.adapters.add(name=adapter.name, scale=adapter.scale)
    if req.extra:
        msg.extra.CopyFrom(struct_from_dict(req.extra))
    if req.webhook is not None:
        msg.webhook.CopyFrom(webhook_to_proto(req.webhook))
    return msg


def media_to_proto(item: t.MediaInput, target: types_pb2.MediaInput) -> None:
    """Fill `target` (a new `omnirt.v1.MediaInput`) from `item`: its URI, else its bytes."""
    target.role = enum_to_proto(types_pb2.MediaRole, "MEDIA_ROLE_", item.role)
    target.mime_type = item.mime_type
    if item.uri:
        target.uri = item.uri
    else:
        target.data = item.data


def media_from_proto(media: types_pb2.MediaInput) -> t.MediaInput:
    """`omnirt.v1.MediaInput` -> `MediaInput` (an unknown role is None: validation refuses it)."""
    role = enum_from_proto(types_pb2.MediaRole, "MEDIA_ROLE_", t.MediaRole, media.role)
    return t.MediaInput(role=role, data=media.data, uri=media.uri, mime_type=media.mime_type)


def webhook_to_proto(w: t.Webhook) -> types_pb2.Webhook:
    """`Webhook` -> `omnirt.v1.Webhook` (an unknown event name is a ValueError naming it)."""
    msg = types_pb2.Webhook(url=w.url, progress_interval_ms=w.progress_interval_ms)
    for name in w.events:
        msg.events.append(enum_to_proto(types_pb2.WebhookEvent, "WEBHOOK_EVENT_", t.WebhookEvent(name)))
    return msg


def webhook_from_proto(m: types_pb2.Webhook) -> t.Webhook:
    """`omnirt.v1.Webhook` -> `Webhook`; unknown event numbers are left out (the servicer refuses them)."""
    events = [enum_from_proto(types_pb2.WebhookEvent, "WEBHOOK_EVENT_", t.WebhookEvent, e) for e in m.events]
    return t.Webhook(
        url=m.url, events=[e for e in events if e is not None], progress_interval_ms=m.progress_interval_ms
    )


def request_from_bytes(data: bytes) -> t.GenerateRequest:
    """A stored `GenerateRequest` proto's bytes -> `GenerateRequest`."""
    return request_from_proto(types_pb2.GenerateRequest.FromString(data))


def request_from_proto(msg: types_pb2.GenerateRequest) -> t.GenerateRequest:
    req = t.GenerateRequest(
        model=msg.model,
        task=task_from_proto(msg.task),  # type: ignore[arg-type]  # validation rejects None
        prompt=msg.prompt,
        negative_prompt=msg.negative_prompt,
        scheduler=msg.scheduler,
        preset=msg.preset,
        priority=msg.priority,
        deadline_ms=msg.deadline_ms,
        timeout_ms=msg.timeout_ms,
        idempotency_key=msg.idempotency_key,
        labels=dict(msg.labels),
        extra=dict_from_struct(msg.extra, finite=False),
        output_format=msg.output.format,
        inline_limit_bytes=msg.output.inline_limit_bytes,
        quality=msg.output.quality,
        adapters=[t.Adapter(a.name, a.scale if a.HasField("scale") else 1.0) for a in msg.adapters],
    )
    for name in _OPTIONAL_REQUEST_FIELDS:
        setattr(req, name, _opt(msg, name))
    req.inputs.extend(media_from_proto(media) for media in msg.inputs)
    if msg.HasField("webhook"):
        req.webhook = webhook_from_proto(msg.webhook)
    return req


# ---- results -----------------------------------------------------------------------------


def artifact_to_proto(a: t.Artifact) -> types_pb2.Artifact:
    return types_pb2.Artifact(
        index=a.index,
        kind=enum_to_proto(types_pb2.MediaKind, "MEDIA_KIND_", a.kind),
        mime_type=a.mime_type,
        data=a.data,
        uri=a.uri,
        size_bytes=a.size_bytes,
        sha256=a.sha256,
        width=a.width,
        height=a.height,
        num_frames=a.num_frames,
        fps=a.fps,
        duration_ms=a.duration_ms,
        seed=a.seed,
        file_name=a.file_name,
        sample_rate=a.sample_rate,
        channels=a.channels,
        url=a.url,
        url_expires_at_ms=a.url_expires_at_ms,
        object_uri=a.object_uri,
    )


def artifact_from_proto(m: types_pb2.Artifact) -> t.Artifact:
    return t.Artifact(
        index=m.index,
        kind=enum_from_proto(types_pb2.MediaKind, "MEDIA_KIND_", t.MediaKind, m.kind),
        mime_type=m.mime_type,
        data=m.data,
        uri=m.uri,
        size_bytes=m.size_bytes,
        sha256=m.sha256,
        width=m.width,
        height=m.height,
        num_frames=m.num_frames,
        fps=m.fps,
        duration_ms=m.duration_ms,
        seed=m.seed,
        file_name=m.file_name,
        sample_rate=m.sample_rate,
        channels=m.channels,
        url=m.url,
        url_expires_at_ms=m.url_expires_at_ms,
        object_uri=m.object_uri,
    )


def report_to_proto(r: t.RunReport) -> types_pb2.RunReport:
    msg = types_pb2.RunReport(
        schema_version=r.schema_version,
        run_id=r.run_id,
        job_id=r.job_id,
        worker_id=r.worker_id,
        model=r.model,
        task=task_to_proto(r.task),
        backend=r.backend,
        execution_mode=r.execution_mode,
        device=r.device,
        dtype=r.dtype,
        queue_wait_ms=r.queue_wait_ms,
        execution_ms=r.execution_ms,
        peak_memory_bytes=r.peak_memory_bytes,
        cold_start=r.cold_start,
        attempt=r.attempt,
        batch_size=r.batch_size,
        batch_group_id=r.batch_group_id,
        seeds=r.seeds,
        cache_hits=r.cache_hits,
        trace_id=r.trace_id,
        warnings=r.warnings,
        pipeline_class=r.pipeline_class,
        omnirt_version=r.omnirt_version,
        tenant=r.tenant,
    )
    for timing in r.timings:
        msg.timings.add(
            name=timing.name, duration_ms=timing.duration_ms, start_offset_ms=timing.start_offset_ms
        )
    if r.config_resolved:
        msg.config_resolved.CopyFrom(struct_from_dict(r.config_resolved))
    ts_to_proto(r.started_at, msg.started_at)
    ts_to_proto(r.finished_at, msg.finished_at)
    return msg


def report_from_proto(m: types_pb2.RunReport) -> t.RunReport:
    return t.RunReport(
        schema_version=m.schema_version,
        run_id=m.run_id,
        job_id=m.job_id,
        worker_id=m.worker_id,
        model=m.model,
        task=task_from_proto(m.task),
        backend=m.backend,
        execution_mode=m.execution_mode,
        device=m.device,
        dtype=m.dtype,
        queue_wait_ms=m.queue_wait_ms,
        timings=[t.StageTiming(s.name, s.duration_ms, s.start_offset_ms) for s in m.timings],
        execution_ms=m.execution_ms,
        peak_memory_bytes=m.peak_memory_bytes,
        config_resolved=integral(dict_from_struct(m.config_resolved)),
        cold_start=m.cold_start,
        attempt=m.attempt,
        batch_size=m.batch_size,
        batch_group_id=m.batch_group_id,
        seeds=list(m.seeds),
        cache_hits=dict(m.cache_hits),
        trace_id=m.trace_id,
        warnings=list(m.warnings),
        started_at=ts_from_proto(m, "started_at"),
        finished_at=ts_from_proto(m, "finished_at"),
        pipeline_class=m.pipeline_class,
        omnirt_version=m.omnirt_version,
        tenant=m.tenant,
    )


def result_to_proto(r: t.GenerateResult) -> types_pb2.GenerateResult:
    return types_pb2.GenerateResult(
        job_id=r.job_id,
        artifacts=[artifact_to_proto(a) for a in r.artifacts],
        report=report_to_proto(r.report),
    )


def result_from_proto(m: types_pb2.GenerateResult) -> t.GenerateResult:
    return t.GenerateResult(
        job_id=m.job_id,
        artifacts=[artifact_from_proto(a) for a in m.artifacts],
        report=report_from_proto(m.report),
    )


def error_to_proto(e: t.JobError) -> types_pb2.JobError:
    return types_pb2.JobError(code=e.code, message=e.message, field=e.field)


def error_from_proto(m: types_pb2.JobError) -> t.JobError:
    return t.JobError(code=m.code, message=m.message, field=m.field)


def progress_to_proto(p: t.Progress) -> types_pb2.Progress:
    return types_pb2.Progress(step=p.step, total_steps=p.total_steps, stage=p.stage)


def progress_from_proto(m: types_pb2.Progress) -> t.Progress:
    return t.Progress(step=m.step, total_steps=m.total_steps, stage=m.stage)


# ---- jobs and events ---------------------------------------------------------------------


def job_to_proto(j: t.Job, *, with_result: bool = True) -> types_pb2.Job:
    """`Job` -> message; `with_result=False` leaves the result out (when it travels beside it)."""
    msg = types_pb2.Job(
        id=j.id,
        state=state_to_proto(j.state),
        model=j.model,
        task=task_to_proto(j.task),
        priority=j.priority,
        attempts=j.attempts,
        worker_id=j.worker_id,
        idempotency_key=j.idempotency_key,
        labels=j.labels,
        waiting_reason=j.waiting_reason,
        deadline_ms=j.deadline_ms,
        queue_position=j.queue_position,
        tenant=j.tenant,
    )
    ts_to_proto(j.created_at, msg.created_at)
    ts_to_proto(j.started_at, msg.started_at)
    ts_to_proto(j.finished_at, msg.finished_at)
    if j.error:
        msg.error.CopyFrom(error_to_proto(j.error))
    if j.result and with_result:
        msg.result.CopyFrom(result_to_proto(j.result))
    if j.progress:
        msg.progress.CopyFrom(progress_to_proto(j.progress))
    if j.webhook is not None:
        msg.webhook.CopyFrom(webhook_to_proto(j.webhook))
    return msg


def job_from_proto(m: types_pb2.Job) -> t.Job:
    return t.Job(
        id=m.id,
        state=state_from_proto(m.state),  # type: ignore[arg-type]  # a controller's job always has a state
        model=m.model,
        task=task_from_proto(m.task),
        priority=m.priority,
        created_at=ts_from_proto(m, "created_at"),
        started_at=ts_from_proto(m, "started_at"),
        finished_at=ts_from_proto(m, "finished_at"),
        attempts=m.attempts,
        worker_id=m.worker_id,
        error=error_from_proto(m.error) if m.HasField("error") else None,
        result=result_from_proto(m.result) if m.HasField("result") else None,
        progress=progress_from_proto(m.progress) if m.HasField("progress") else None,
        idempotency_key=m.idempotency_key,
        labels=dict(m.labels),
        waiting_reason=m.waiting_reason,
        deadline_ms=m.deadline_ms,
        queue_position=m.queue_position,
        tenant=m.tenant,
        webhook=webhook_from_proto(m.webhook) if m.HasField("webhook") else None,
    )


def event_to_proto(e: t.JobEvent) -> types_pb2.JobEvent:
    msg = types_pb2.JobEvent(job_id=e.job_id, sequence=e.sequence)
    ts_to_proto(e.time, msg.time)
    if e.kind is t.EventKind.STATE:
        msg.state_change.state = state_to_proto(e.state)
        msg.state_change.worker_id = e.worker_id
        msg.state_change.attempt = e.attempt
        if e.error:
            msg.state_change.error.CopyFrom(error_to_proto(e.error))
    elif e.kind is t.EventKind.PROGRESS:
        msg.progress.CopyFrom(progress_to_proto(e.progress or t.Progress()))
    elif e.kind is t.EventKind.STAGE:
        msg.stage.name = e.stage
        msg.stage.finished = e.stage_finished
        msg.stage.duration_ms = e.stage_duration_ms
    elif e.kind is t.EventKind.PREVIEW:
        msg.preview.step = e.progress.step if e.progress else 0
        msg.preview.mime_type = e.preview_mime_type
        msg.preview.data = e.preview
    elif e.kind is t.EventKind.LOG:
        msg.log.stream = e.log_stream
        msg.log.text = e.log_text
    elif e.kind is t.EventKind.RESULT and e.result is not None:
        msg.result.CopyFrom(result_to_proto(e.result))
    return msg


def event_from_proto(m: types_pb2.JobEvent) -> t.JobEvent:
    kind = m.WhichOneof("kind")
    e = t.JobEvent(job_id=m.job_id, kind=t.EventKind.LOG, sequence=m.sequence, time=ts_from_proto(m, "time"))
    if kind == "state_change":
        e.kind = t.EventKind.STATE
        e.state = state_from_proto(m.state_change.state)
        e.worker_id = m.state_change.worker_id
        e.attempt = m.state_change.attempt
        if m.state_change.HasField("error"):
            e.error = error_from_proto(m.state_change.error)
    elif kind == "progress":
        e.kind = t.EventKind.PROGRESS
        e.progress = progress_from_proto(m.progress)
    elif kind == "stage":
        e.kind = t.EventKind.STAGE
        e.stage, e.stage_finished, e.stage_duration_ms = m.stage.name, m.stage.finished, m.stage.duration_ms
    elif kind == "preview":
        e.kind = t.EventKind.PREVIEW
        e.progress = t.Progress(step=m.preview.step)
        e.preview, e.preview_mime_type = m.preview.data, m.preview.mime_type
    elif kind == "log":
        e.log_stream, e.log_text = m.log.stream, m.log.text
    elif kind == "result":
        e.kind = t.EventKind.RESULT
        e.result = result_from_proto(m.result)
    return e
