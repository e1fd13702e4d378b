"""The worker protocol's stream messages <-> `messages`: one converter each way, for both daemons.

`to_worker` / `from_controller` are the two ends of what the controller sends (ConnectResponse);
`to_controller` / `from_worker` of what the worker sends (ConnectRequest). The public messages
inside them go through `omnirt._internal.convert`. A message this side does not know converts to
None (a newer peer's message is ignored, never fatal); a part that cannot be read raises, and the
reader decides what that costs (a job, never the stream).

The worker reads the controller's stream as raw bytes (`controller_messages`, at the end), so
that one message it cannot parse (nested deeper than protobuf decodes, say) costs only its own
jobs: each message of a batch is parsed alone, and of one that fails only the assignment and job
ids are read, which never nest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from omnirt import types as t
from omnirt._internal import catalog_convert
from omnirt._internal import convert as c
from omnirt._internal.protocol import messages as m
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt.v1 import models_pb2, realtime_pb2

# The Connect stream's path (for a call that reads raw bytes: `tolerant.controller_messages`).
CONNECT_METHOD = "/{}/Connect".format(pb.DESCRIPTOR.services_by_name["WorkerGatewayService"].full_name)

# ---- worker -> controller ----------------------------------------------------------------


def to_controller(message: m.WorkerMessage) -> pb.ConnectRequest:
    """A worker message as it goes up the stream."""
    if isinstance(message, m.AssignmentEvent):
        event = pb.AssignmentEvent(assignment_id=message.assignment_id, event=c.event_to_proto(message.event))
        return pb.ConnectRequest(event=event)
    if isinstance(message, m.AssignmentResult):
        return pb.ConnectRequest(result=result_to_proto(message))
    if isinstance(message, m.Heartbeat):
        return pb.ConnectRequest(heartbeat=_heartbeat_to_proto(message))
    if isinstance(message, m.Hello):
        return pb.ConnectRequest(hello=_hello_to_proto(message))
    if isinstance(message, m.ModelLoaded):
        return pb.ConnectRequest(model_loaded=_model_loaded_to_proto(message))
    raise TypeError(f"not a worker message: {message!r}")


def batch_to_controller(messages: list[pb.ConnectRequest]) -> pb.ConnectRequest:
    """Several converted messages as one stream message (for a controller that reads batches)."""
    return pb.ConnectRequest(batch=pb.ConnectRequestBatch(messages=messages))


def from_worker(msg: pb.ConnectRequest) -> m.WorkerMessage | None:
    """One worker message (not a batch: see `unbatched`), or None for a kind this side does not know.

    A result's own GenerateResult is converted too; the controller's stream reads results
    through `result_from_proto` itself, as it keeps the message's bytes.
    """
    kind = msg.WhichOneof("message")
    if kind == "heartbeat":
        return heartbeat_from_proto(msg.heartbeat)
    if kind == "event":
        return m.AssignmentEvent(msg.event.assignment_id, c.event_from_proto(msg.event.event))
    if kind == "result":
        return result_from_proto(msg.result)
    if kind == "model_loaded":
        return model_loaded_from_proto(msg.model_loaded)
    if kind == "hello":
        return hello_from_proto(msg.hello)
    return None


def unbatched_requests(msg: pb.ConnectRequest) -> list[pb.ConnectRequest]:
    """The worker messages in `msg`, in order: those of a batch (never nested), or `msg` itself."""
    if msg.WhichOneof("message") == "batch":
        return [one for one in msg.batch.messages if one.WhichOneof("message") != "batch"]
    return [msg]


def _hello_to_proto(h: m.Hello) -> pb.Hello:
    return pb.Hello(
        worker_id=h.worker_id,
        execution_mode=h.execution_mode,
        backend=h.backend,
        models=h.models,
        slots=h.slots,
        loaded_models=h.loaded_models,
        hostname=h.hostname,
        pid=h.pid,
        version=h.version,
        labels=h.labels,
        token=h.token,
        accepts_batches=h.accepts_batches,
        instance_id=h.instance_id,
        reports_running=h.reports_running,
        session_slots=h.session_slots,
        loads_models=h.loads_models,
        step_rows=h.step_rows,
        step_pipelines=h.step_pipelines,
        device=h.device,
    )


def hello_from_proto(h: pb.Hello) -> m.Hello:
    """A Hello as plain data."""
    return m.Hello(
        worker_id=h.worker_id,
        execution_mode=h.execution_mode,
        backend=h.backend,
        slots=h.slots,
        models=list(h.models),
        loaded_models=list(h.loaded_models),
        hostname=h.hostname,
        pid=h.pid,
        version=h.version,
        labels=dict(h.labels),
        token=h.token,
        accepts_batches=h.accepts_batches,
        instance_id=h.instance_id,
        reports_running=h.reports_running,
        session_slots=h.session_slots,
        loads_models=h.loads_models,
        step_rows=h.step_rows,
        step_pipelines=list(h.step_pipelines),
        device=h.device,
    )


def _heartbeat_to_proto(b: m.Heartbeat) -> pb.Heartbeat:
    return pb.Heartbeat(
        busy_slots=b.busy_slots,
        loaded_models=b.loaded_models,
        memory_bytes=b.memory_bytes,
        draining=b.draining,
        running=[pb.RunningJob(assignment_id=a, job_id=j) for j, a in b.running.items()],
        sessions=b.sessions,
        loaded=[pb.LoadedModel(model_id=k, memory_bytes=n) for k, n in sorted(b.model_bytes.items())],
        jobs_succeeded=b.jobs_succeeded,
        jobs_failed=b.jobs_failed,
    )


def heartbeat_from_proto(b: pb.Heartbeat) -> m.Heartbeat:
    """A Heartbeat as plain data."""
    return m.Heartbeat(
        busy_slots=b.busy_slots,
        loaded_models=list(b.loaded_models),
        memory_bytes=b.memory_bytes,
        draining=b.draining,
        running={r.job_id: r.assignment_id for r in b.running},
        sessions=list(b.sessions),
        model_bytes={x.model_id: x.memory_bytes for x in b.loaded},
        jobs_succeeded=b.jobs_succeeded,
        jobs_failed=b.jobs_failed,
    )


def result_to_proto(r: m.AssignmentResult) -> pb.AssignmentResult:
    """The end of one job: its GenerateResult, or its JobError (INTERNAL when it has neither)."""
    msg = pb.AssignmentResult(assignment_id=r.assignment_id, job_id=r.outcome.job_id)
    if r.outcome.result is not None:
        msg.result.CopyFrom(c.result_to_proto(r.outcome.result))
    else:
        error = r.outcome.error or t.JobError("INTERNAL", "the worker produced neither a result nor an error")
        msg.error.CopyFrom(c.error_to_proto(error))
    return msg


def result_from_proto(r: pb.AssignmentResult) -> m.AssignmentResult:
    """An AssignmentResult as plain data (one without an outcome is an INTERNAL error)."""
    outcome = m.ItemOutcome(r.job_id)
    kind = r.WhichOneof("outcome")
    if kind == "result":
        outcome.result = c.result_from_proto(r.result)
    elif kind == "error":
        outcome.error = c.error_from_proto(r.error)
    else:
        outcome.error = t.JobError("INTERNAL", "worker sent a result without an outcome")
    return m.AssignmentResult(r.assignment_id, outcome)


def _model_loaded_to_proto(a: m.ModelLoaded) -> pb.ModelLoaded:
    msg = pb.ModelLoaded(
        request_id=a.request_id,
        model_id=a.model_id,
        ok=a.error is None and a.ok,
        load_ms=a.load_ms,
        memory_bytes=a.memory_bytes,
        unchanged=a.unchanged,
    )
    if a.error is not None:
        msg.error.CopyFrom(c.error_to_proto(a.error))
    return msg


def model_loaded_from_proto(a: pb.ModelLoaded) -> m.ModelLoaded:
    """A ModelLoaded as plain data.

    A refusal's error gets a code and at most 1000 characters of text (it is quoted in a status).
    """
    error = None
    if not a.ok:
        error = c.error_from_proto(a.error)
        error.code = error.code or "UNKNOWN"
        error.message = error.message[:1000]
    return m.ModelLoaded(
        request_id=a.request_id,
        model_id=a.model_id,
        ok=a.ok,
        error=error,
        load_ms=a.load_ms,
        memory_bytes=a.memory_bytes,
        unchanged=a.unchanged,
    )


# ---- controller -> worker ----------------------------------------------------------------


class SpecCache:
    """Each ModelSpec's message, made once per spec object.

    Every assignment of a model carries its spec, and a catalog's specs do not change once loaded
    (a changed model is a new object). Holding the spec keeps its id from being reused while
    cached; specs made per call (not a catalog's) keep it bounded.
    """

    def __init__(self, limit: int = 256) -> None:
        self._specs: dict[int, tuple[t.ModelSpec, models_pb2.ModelSpec]] = {}
        self._limit = limit

    def encoded(self, spec: t.ModelSpec) -> models_pb2.ModelSpec:
        """`spec` as a message (the same message object each time: never modify it)."""
        hit = self._specs.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        if len(self._specs) >= self._limit:
            self._specs.clear()
        message = catalog_convert.model_to_proto(spec)
        self._specs[id(spec)] = (spec, message)
        return message


_SPECS = SpecCache()


def to_worker(message: m.ControllerMessage) -> pb.ConnectResponse:
    """A controller message as it goes down the stream."""
    if isinstance(message, m.Assignment):
        return pb.ConnectResponse(assignment=assignment_to_proto(message))
    if isinstance(message, m.CancelAssignment):
        cancel = pb.CancelAssignment(
            assignment_id=message.assignment_id, job_id=message.job_id, reason=message.reason
        )
        return pb.ConnectResponse(cancel=cancel)
    if isinstance(message, m.Drain):
        return pb.ConnectResponse(drain=pb.Drain(reason=message.reason))
    if isinstance(message, m.SessionOffer):
        return pb.ConnectResponse(session_offer=_session_offer_to_proto(message))
    if isinstance(message, m.LoadModel):
        load = pb.LoadModel(request_id=message.request_id, model=_SPECS.encoded(message.model))
        return pb.ConnectResponse(load_model=load)
    if isinstance(message, m.UnloadModel):
        unload = pb.UnloadModel(
            request_id=message.request_id, model_id=message.model_id, deadline_ms=message.deadline_ms
        )
        return pb.ConnectResponse(unload_model=unload)
    if isinstance(message, m.Welcome):
        return pb.ConnectResponse(welcome=_welcome_to_proto(message))
    raise TypeError(f"not a controller message: {message!r}")


def batch_to_worker(messages: list[pb.ConnectResponse]) -> pb.ConnectResponse:
    """Several converted messages as one stream message (for a worker that reads batches)."""
    return pb.ConnectResponse(batch=pb.ConnectResponseBatch(messages=messages))


def from_controller(msg: pb.ConnectResponse) -> m.ControllerMessage | None:
    """One controller message (not a batch: see `unbatched_responses`).

    None for a kind this worker does not know.
    """
    kind = msg.WhichOneof("message")
    if kind == "assignment":
        return assignment_from_proto(msg.assignment)
    if kind == "cancel":
        cancel = msg.cancel
        return m.CancelAssignment(cancel.assignment_id, cancel.job_id, cancel.reason)
    if kind == "welcome":
        w = msg.welcome
        return m.Welcome(
            w.worker_id,
            w.heartbeat_interval_ms,
            w.lease_timeout_ms,
            w.accepts_batches,
            list(w.warnings),
            w.artifact_store,
        )
    if kind == "drain":
        return m.Drain(msg.drain.reason)
    if kind == "session_offer":
        return session_offer_from_proto(msg.session_offer)
    if kind == "load_model":
        return m.LoadModel(msg.load_model.request_id, catalog_convert.model_from_proto(msg.load_model.model))
    if kind == "unload_model":
        u = msg.unload_model
        return m.UnloadModel(u.request_id, u.model_id, u.deadline_ms)
    return None


def unbatched_responses(msg: pb.ConnectResponse) -> list[pb.ConnectResponse]:
    """The controller messages in `msg`, in order: those of a batch, or `msg` itself."""
    if msg.WhichOneof("message") == "batch":
        return list(msg.batch.messages)
    return [msg]


def _welcome_to_proto(w: m.Welcome) -> pb.Welcome:
    return pb.Welcome(
        worker_id=w.worker_id,
        heartbeat_interval_ms=w.heartbeat_interval_ms,
        lease_timeout_ms=w.lease_timeout_ms,
        accepts_batches=w.accepts_batches,
        warnings=w.warnings,
        artifact_store=w.artifact_store,
    )


def assignment_to_proto(a: m.Assignment) -> pb.Assignment:
    """An Assignment as a message.

    Its model's spec is encoded once per spec; each request comes from the bytes its item
    carries (the controller's store encoded it once), else is converted.
    """
    msg = pb.Assignment(
        assignment_id=a.assignment_id,
        model=_SPECS.encoded(a.model),
        deadline_ms=a.deadline_ms,
        trace_context=a.trace_context,
        batch_group_id=a.batch_group_id,
        joins_batch=a.joins_batch,
    )
    for i in a.items:
        item = msg.items.add(job_id=i.job_id, attempt=i.attempt, queue_wait_ms=i.queue_wait_ms)
        if i.encoded_request:
            item.request.MergeFromString(i.encoded_request)
        else:
            item.request.CopyFrom(c.request_to_proto(i.request))
    return msg


def assignment_from_proto(msg: pb.Assignment) -> m.Assignment:
    """An Assignment as plain data."""
    items = [
        m.AssignmentItem(
            job_id=item.job_id,
            request=c.request_from_proto(item.request),
            attempt=item.attempt,
            queue_wait_ms=item.queue_wait_ms,
        )
        for item in msg.items
    ]
    return m.Assignment(
        assignment_id=msg.assignment_id,
        model=catalog_convert.model_from_proto(msg.model),
        items=items,
        deadline_ms=msg.deadline_ms,
        trace_context=dict(msg.trace_context),
        batch_group_id=msg.batch_group_id,
        joins_batch=msg.joins_batch,
    )


def session_settings_to_proto(s: m.SessionSettings) -> realtime_pb2.SessionOpen:
    """A session's settings as the SessionOpen they came as."""
    opened = realtime_pb2.SessionOpen(
        model=s.model,
        video_encoding=s.video_encoding,
        audio_format=s.audio_format,
        sample_rate=s.sample_rate,
        fps=s.fps,
        width=s.width,
        height=s.height,
        labels=s.labels,
        idle_timeout_ms=s.idle_timeout_ms,
    )
    for item in s.inputs:
        c.media_to_proto(item, opened.inputs.add())
    if s.config:
        opened.config.CopyFrom(c.struct_from_dict(s.config))
    return opened


def session_settings_from_proto(
    opened: realtime_pb2.SessionOpen, *, finite: bool = True
) -> m.SessionSettings:
    """A SessionOpen as plain values; ValueError for a config that cannot be read (a NaN, say).

    `finite=False` keeps NaN and infinities in the config (the controller refuses them naming
    the key, as it does a request's `extra`).
    """
    return m.SessionSettings(
        model=opened.model,
        inputs=[c.media_from_proto(media) for media in opened.inputs],
        video_encoding=opened.video_encoding,
        audio_format=opened.audio_format,
        sample_rate=opened.sample_rate,
        fps=opened.fps,
        width=opened.width,
        height=opened.height,
        labels=dict(opened.labels),
        config=c.dict_from_struct(opened.config, finite=finite),
        idle_timeout_ms=opened.idle_timeout_ms,
    )


def _session_offer_to_proto(o: m.SessionOffer) -> pb.SessionOffer:
    return pb.SessionOffer(
        session_id=o.session_id,
        model=_SPECS.encoded(o.model),
        open=session_settings_to_proto(o.settings),
        trace_context=o.trace_context,
        deadline_ms=o.deadline_ms,
    )


def session_offer_from_proto(msg: pb.SessionOffer) -> m.SessionOffer:
    """A SessionOffer as plain data.

    A part the worker cannot read sets `error`: the session fails, not the stream.
    """
    offer = m.SessionOffer(
        session_id=msg.session_id,
        model=t.ModelSpec(id=msg.model.id),
        trace_context=dict(msg.trace_context),
        deadline_ms=msg.deadline_ms,
    )
    try:
        offer.model = catalog_convert.model_from_proto(msg.model)
        offer.settings = session_settings_from_proto(msg.open)
    except Exception as exc:  # a NaN in config, say
        offer.error = t.JobError("INVALID_ARGUMENT", f"the worker cannot read the session offer: {exc}")
    return offer


# ---- the worker's reader of raw bytes: one message at a time -------------------------------------


def assignment_job_ids(msg: pb.ConnectResponse) -> tuple[str, list[str]]:
    """(assignment id, job ids) of an assignment message, read without converting the requests.

    For answering an assignment whose conversion failed.
    """
    if msg.WhichOneof("message") != "assignment":
        return "", []
    return msg.assignment.assignment_id, [item.job_id for item in msg.assignment.items]


@dataclass
class Undecodable:
    """A controller message protobuf could not parse; the assignment and jobs it held, if any."""

    assignment_id: str
    job_ids: list[str]
    reason: str


def controller_messages(data: bytes) -> list[pb.ConnectResponse | Undecodable]:
    """The controller messages in one stream message (a batch's, in order) from its wire bytes."""
    out: list[pb.ConnectResponse | Undecodable] = []
    try:
        out += unbatched_responses(pb.ConnectResponse.FromString(data))
        return out
    except DecodeError as exc:
        reason = str(exc)
    try:
        fields = list(_wire_fields(data))
    except ValueError:
        return [Undecodable("", [], reason)]
    batch = [value for number, value in fields if number == _BATCH_FIELD and isinstance(value, bytes)]
    if not batch:
        return [_undecodable(fields, reason)]
    # A field that occurs more than once is one message merged from all (as protobuf reads it).
    for number, value in _wire_fields_or_empty(b"".join(batch)):
        if number == _BATCH_MESSAGES_FIELD and isinstance(value, bytes):
            try:
                out.append(pb.ConnectResponse.FromString(value))
            except DecodeError as exc:
                out.append(_undecodable(_wire_fields_or_empty(value), str(exc)))
    return out


_BATCH_FIELD = pb.ConnectResponse.DESCRIPTOR.fields_by_name["batch"].number
_BATCH_MESSAGES_FIELD = pb.ConnectResponseBatch.DESCRIPTOR.fields_by_name["messages"].number
_ASSIGNMENT_FIELD = pb.ConnectResponse.DESCRIPTOR.fields_by_name["assignment"].number
_ASSIGNMENT_ID_FIELD = pb.Assignment.DESCRIPTOR.fields_by_name["assignment_id"].number
_ITEMS_FIELD = pb.Assignment.DESCRIPTOR.fields_by_name["items"].number
_JOB_ID_FIELD = pb.AssignmentItem.DESCRIPTOR.fields_by_name["job_id"].number


def _undecodable(fields: list[tuple[int, bytes | int]], reason: str) -> Undecodable:
    """The ids of the assignment among a ConnectResponse's wire fields (none for another kind)."""
    assignment = [
        value for number, value in fields if number == _ASSIGNMENT_FIELD and isinstance(value, bytes)
    ]
    if not assignment:
        return Undecodable("", [], reason)
    assignment_id, job_ids = "", []
    for number, value in _wire_fields_or_empty(b"".join(assignment)):
        if number == _ASSIGNMENT_ID_FIELD and isinstance(value, bytes):
            assignment_id = value.decode("utf-8", "replace")
        elif number == _ITEMS_FIELD and isinstance(value, bytes):
            for inner, item in _wire_fields_or_empty(value):
                if inner == _JOB_ID_FIELD and isinstance(item, bytes):
                    job_ids.append(item.decode("utf-8", "replace"))
    return Undecodable(assignment_id, job_ids, reason)


def _wire_fields_or_empty(data: bytes) -> list[tuple[int, bytes | int]]:
    try:
        return list(_wire_fields(data))
    except ValueError:
        return []


def _wire_fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of one message's top-level fields, by protobuf's wire format.

    Varints as ints, length-delimited and fixed-width fields as bytes; ValueError when corrupt.
    """
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(data, pos)
            yield number, value
            continue
        if wire_type == 2:
            size, pos = _varint(data, pos)
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
        else:  # groups (3, 4) are not in omnirt's protos
            raise ValueError(f"wire type {wire_type}")
        if pos + size > len(data):
            raise ValueError("truncated")
        yield number, data[pos : pos + size]
        pos += size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("bad varint")
