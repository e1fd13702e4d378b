"""The worker side of `omnirt.worker.v1`: gateway messages <-> plain dataclasses.

The one module of the worker that reads or builds Connect stream messages; the daemon and
the executors work on the dataclasses below and on `omnirt.types`. Public contract messages
inside them (GenerateRequest, ModelSpec, JobEvent, GenerateResult, JobError) go through
`omnirt._internal.convert`. A realtime session's own stream (WorkerSession) is converted by
`omnirt.worker.sessions.wire`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import types_pb2

# The Connect stream's path, for a call that reads raw bytes (see controller_messages).
CONNECT_METHOD = "/{}/Connect".format(
    gateway_pb2.DESCRIPTOR.services_by_name["WorkerGatewayService"].full_name
)


@dataclass
class AssignmentItem:
    """One job of an assignment; `request` is already resolved by the controller."""

    job_id: str
    request: t.GenerateRequest
    attempt: int = 1
    queue_wait_ms: float = 0.0


@dataclass
class Assignment:
    """One pipeline call the controller gives this worker: one job or a batch of compatible jobs."""

    assignment_id: str
    model: t.ModelSpec
    items: list[AssignmentItem] = field(default_factory=list)
    # Absolute deadline in Unix epoch milliseconds; 0 = none.
    deadline_ms: int = 0
    trace_context: dict[str, str] = field(default_factory=dict)
    batch_group_id: str = ""

    @property
    def job_ids(self) -> list[str]:
        """The ids of the jobs, in item order."""
        return [item.job_id for item in self.items]


@dataclass
class ItemOutcome:
    """How one job of an assignment ended: exactly one of `result` and `error` is set."""

    job_id: str
    result: t.GenerateResult | None = None
    error: t.JobError | None = None


@dataclass
class Welcome:
    """The controller accepted this worker."""

    worker_id: str
    heartbeat_interval_ms: int
    lease_timeout_ms: int
    # The controller reads batches: several messages may go up as one (`batch_message`).
    accepts_batches: bool = False
    # What the controller found wrong with the Hello (e.g. a model its catalog lacks).
    warnings: list[str] = field(default_factory=list)
    # The controller's --artifact-store ("" = none): the worker uploads only to that same store.
    artifact_store: str = ""


@dataclass
class CancelRequest:
    """Stop a job at its next step; `reason` becomes the JobError code."""

    assignment_id: str
    job_id: str
    reason: str


@dataclass
class DrainRequest:
    """Finish what runs, take nothing new, exit."""

    reason: str


@dataclass
class SessionSettings:
    """A session's SessionOpen as plain values (0 / "" = the model's or the default)."""

    reference_image: bytes | None = None  # the first MEDIA_ROLE_IMAGE input's inline bytes
    reference_uri: str = ""  # that input's URI, when it came by reference
    video_encoding: str = ""
    audio_format: str = ""
    sample_rate: int = 0
    fps: float = 0.0
    width: int = 0
    height: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    idle_timeout_ms: int = 0


@dataclass
class SessionOffer:
    """Host a realtime session: dial WorkerSession and attach. `error` is set when the offer
    itself cannot be read (the worker attaches and answers it)."""

    session_id: str
    model: t.ModelSpec
    settings: SessionSettings = field(default_factory=SessionSettings)
    trace_context: dict[str, str] = field(default_factory=dict)
    # Absolute end in Unix epoch milliseconds; 0 = none.
    deadline_ms: int = 0
    error: t.JobError | None = None


@dataclass
class LoadModelRequest:
    """Make `model` warm (ModelService.LoadModel); answered with `model_loaded_message`."""

    request_id: str
    model: t.ModelSpec


@dataclass
class UnloadModelRequest:
    """Free `model_id` once no job of it runs here, giving up at `deadline_ms` (epoch ms; 0 = none)."""

    request_id: str
    model_id: str
    deadline_ms: int = 0


ControllerMessage = (
    Welcome | Assignment | CancelRequest | DrainRequest | SessionOffer | LoadModelRequest | UnloadModelRequest
)


def hello_message(
    *,
    worker_id: str,
    execution_mode: str,
    backend: str,
    models: list[str],
    slots: int,
    loaded_models: list[str],
    hostname: str,
    pid: int,
    version: str,
    labels: dict[str, str] | None = None,
    token: str = "",
    accepts_batches: bool = True,
    instance_id: str = "",
    session_slots: int = 0,
) -> gateway_pb2.ConnectRequest:
    """The first message of every stream (this worker reads batches unless told otherwise, and
    its heartbeats list the jobs it holds)."""
    hello = gateway_pb2.Hello(
        worker_id=worker_id,
        execution_mode=execution_mode,
        backend=backend,
        models=models,
        slots=slots,
        loaded_models=loaded_models,
        hostname=hostname,
        pid=pid,
        version=version,
        labels=labels or {},
        token=token,
        accepts_batches=accepts_batches,
        instance_id=instance_id,
        reports_running=True,
        session_slots=session_slots,
        loads_models=True,
    )
    return gateway_pb2.ConnectRequest(hello=hello)


def heartbeat_message(
    *,
    busy_slots: int,
    loaded_models: list[str],
    memory_bytes: int,
    draining: bool,
    running: dict[str, str] | None = None,
    sessions: list[str] | None = None,
    model_bytes: dict[str, int] | None = None,
) -> gateway_pb2.ConnectRequest:
    """A lease-keeping heartbeat; `running` maps each job the worker holds to its assignment,
    `sessions` are the realtime sessions it hosts, `model_bytes` the bytes of each loaded model
    the executor measures."""
    beat = gateway_pb2.Heartbeat(
        busy_slots=busy_slots,
        loaded_models=loaded_models,
        memory_bytes=memory_bytes,
        draining=draining,
        running=[
            gateway_pb2.RunningJob(assignment_id=assignment_id, job_id=job_id)
            for job_id, assignment_id in (running or {}).items()
        ],
        sessions=sessions or [],
        loaded=[
            gateway_pb2.LoadedModel(model_id=model_id, memory_bytes=nbytes)
            for model_id, nbytes in sorted((model_bytes or {}).items())
        ],
    )
    return gateway_pb2.ConnectRequest(heartbeat=beat)


def model_loaded_message(
    request_id: str,
    model_id: str,
    *,
    error: t.JobError | None = None,
    load_ms: float = 0.0,
    memory_bytes: int = 0,
    unchanged: bool = False,
) -> gateway_pb2.ConnectRequest:
    """The answer to a LoadModelRequest or UnloadModelRequest: done as asked, or `error`."""
    answer = gateway_pb2.ModelLoaded(
        request_id=request_id,
        model_id=model_id,
        ok=error is None,
        load_ms=load_ms,
        memory_bytes=memory_bytes,
        unchanged=unchanged,
    )
    if error is not None:
        answer.error.CopyFrom(_convert.error_to_proto(error))
    return gateway_pb2.ConnectRequest(model_loaded=answer)


def event_message(assignment_id: str, event: t.JobEvent) -> gateway_pb2.ConnectRequest:
    """A job event; the controller numbers events, so `sequence` stays 0."""
    wrapped = gateway_pb2.AssignmentEvent(assignment_id=assignment_id, event=_convert.event_to_proto(event))
    return gateway_pb2.ConnectRequest(event=wrapped)


def result_message(assignment_id: str, outcome: ItemOutcome) -> gateway_pb2.ConnectRequest:
    """The end of one job: its GenerateResult or its JobError."""
    msg = gateway_pb2.AssignmentResult(assignment_id=assignment_id, job_id=outcome.job_id)
    if outcome.result is not None:
        msg.result.CopyFrom(_convert.result_to_proto(outcome.result))
    else:
        error = outcome.error or t.JobError("INTERNAL", "the worker produced neither a result nor an error")
        msg.error.CopyFrom(_convert.error_to_proto(error))
    return gateway_pb2.ConnectRequest(result=msg)


def batch_message(messages: list[gateway_pb2.ConnectRequest]) -> gateway_pb2.ConnectRequest:
    """Several messages as one stream message (for a controller whose Welcome accepts batches)."""
    return gateway_pb2.ConnectRequest(batch=gateway_pb2.ConnectRequestBatch(messages=messages))


def unbatched(msg: gateway_pb2.ConnectResponse) -> list[gateway_pb2.ConnectResponse]:
    """The controller messages in `msg`, in order: those of a batch, or `msg` itself."""
    if msg.WhichOneof("message") == "batch":
        return list(msg.batch.messages)
    return [msg]


def assignment_from_proto(msg: gateway_pb2.Assignment) -> Assignment:
    """An `omnirt.worker.v1.Assignment` as plain data."""
    items = [
        AssignmentItem(
            job_id=item.job_id,
            request=_convert.request_from_proto(item.request),
            attempt=item.attempt,
            queue_wait_ms=item.queue_wait_ms,
        )
        for item in msg.items
    ]
    return Assignment(
        assignment_id=msg.assignment_id,
        model=_convert.model_from_proto(msg.model),
        items=items,
        deadline_ms=msg.deadline_ms,
        trace_context=dict(msg.trace_context),
        batch_group_id=msg.batch_group_id,
    )


def session_offer_from_proto(msg: gateway_pb2.SessionOffer) -> SessionOffer:
    """An `omnirt.worker.v1.SessionOffer` as plain data; a part it cannot read sets `error`."""
    offer = SessionOffer(
        session_id=msg.session_id,
        model=t.ModelSpec(id=msg.model.id),
        trace_context=dict(msg.trace_context),
        deadline_ms=msg.deadline_ms,
    )
    try:
        offer.model = _convert.model_from_proto(msg.model)
        opened = msg.open
        settings = SessionSettings(
            video_encoding=opened.video_encoding,
            audio_format=opened.audio_format,
            sample_rate=opened.sample_rate,
            fps=opened.fps,
            width=opened.width,
            height=opened.height,
            labels=dict(opened.labels),
            config=_convert.dict_from_struct(opened.config),
            idle_timeout_ms=opened.idle_timeout_ms,
        )
    except Exception as exc:  # a NaN in config, say: this session fails, not the stream
        offer.error = t.JobError("INVALID_ARGUMENT", f"the worker cannot read the session offer: {exc}")
        return offer
    images = [media for media in opened.inputs if media.role == types_pb2.MEDIA_ROLE_IMAGE]
    if images:
        settings.reference_image = images[0].data if images[0].WhichOneof("source") == "data" else None
        settings.reference_uri = images[0].uri
    offer.settings = settings
    return offer


def controller_message(msg: gateway_pb2.ConnectResponse) -> ControllerMessage | None:
    """What the controller sent, or None for a message this worker does not know."""
    kind = msg.WhichOneof("message")
    if kind == "welcome":
        w = msg.welcome
        return Welcome(
            w.worker_id,
            w.heartbeat_interval_ms,
            w.lease_timeout_ms,
            w.accepts_batches,
            list(w.warnings),
            w.artifact_store,
        )
    if kind == "assignment":
        return assignment_from_proto(msg.assignment)
    if kind == "cancel":
        c = msg.cancel
        return CancelRequest(c.assignment_id, c.job_id, c.reason)
    if kind == "drain":
        return DrainRequest(msg.drain.reason)
    if kind == "session_offer":
        return session_offer_from_proto(msg.session_offer)
    if kind == "load_model":
        return LoadModelRequest(msg.load_model.request_id, _convert.model_from_proto(msg.load_model.model))
    if kind == "unload_model":
        u = msg.unload_model
        return UnloadModelRequest(u.request_id, u.model_id, u.deadline_ms)
    return None


def message_size(msg: gateway_pb2.ConnectRequest) -> int:
    """Serialized size in bytes (results with inline artifacts can be large)."""
    return msg.ByteSize()


def assignment_job_ids(msg: gateway_pb2.ConnectResponse) -> tuple[str, list[str]]:
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


def controller_messages(data: bytes) -> list[gateway_pb2.ConnectResponse | Undecodable]:
    """The controller messages in one stream message (a batch's, in order) from its wire bytes.

    The stream reads raw bytes so that one message the worker cannot parse (nested deeper than
    protobuf decodes, say) costs only its own jobs: each message of a batch is parsed alone,
    and of one that fails only the assignment and job ids are read, which never nest.
    """
    out: list[gateway_pb2.ConnectResponse | Undecodable] = []
    try:
        out += unbatched(gateway_pb2.ConnectResponse.FromString(data))
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
                out.append(gateway_pb2.ConnectResponse.FromString(value))
            except DecodeError as exc:
                out.append(_undecodable(_wire_fields_or_empty(value), str(exc)))
    return out


_BATCH_FIELD = gateway_pb2.ConnectResponse.DESCRIPTOR.fields_by_name["batch"].number
_BATCH_MESSAGES_FIELD = gateway_pb2.ConnectResponseBatch.DESCRIPTOR.fields_by_name["messages"].number
_ASSIGNMENT_FIELD = gateway_pb2.ConnectResponse.DESCRIPTOR.fields_by_name["assignment"].number
_ASSIGNMENT_ID_FIELD = gateway_pb2.Assignment.DESCRIPTOR.fields_by_name["assignment_id"].number
_ITEMS_FIELD = gateway_pb2.Assignment.DESCRIPTOR.fields_by_name["items"].number
_JOB_ID_FIELD = gateway_pb2.AssignmentItem.DESCRIPTOR.fields_by_name["job_id"].number


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
    """(field number, value) of one message's top-level fields, by protobuf's wire format:
    varints as ints, length-delimited and fixed-width fields as bytes; ValueError when corrupt."""
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
