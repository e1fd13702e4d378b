"""Converters for the worker protocol (`omnirt.worker.v1`), controller side, and the encoded
jobs and results of `core.encoded` (the worker's result kept as sent, a Generate answered from
the store's bytes)."""

from __future__ import annotations

from omnirt._internal import convert as c
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.encoded import EncodedJob
from omnirt.controller.core.jobs import artifact_reference
from omnirt.controller.core.model_loads import WorkerAnswer
from omnirt.controller.core.router import (
    Assignment,
    CancelAssignment,
    Drain,
    LoadModel,
    Outbound,
    SessionOffer,
    UnloadModel,
)
from omnirt.types import GenerateResult, Job, ModelSpec, WorkerInfo, WorkerState
from omnirt.v1 import generation_pb2, models_pb2, types_pb2
from omnirt.worker.v1 import gateway_pb2 as pb

# Converted ModelSpecs by spec object: every assignment carries its model's spec, and catalog
# specs do not change once loaded. The entry holds the spec, so its id is not reused while cached.
_MODELS: dict[int, tuple[ModelSpec, models_pb2.ModelSpec]] = {}
_MODELS_MAX = 256


def worker_from_hello(hello: pb.Hello) -> WorkerInfo:
    return WorkerInfo(
        id=hello.worker_id,
        state=WorkerState.READY,
        execution_mode=hello.execution_mode,
        backend=hello.backend,
        models=list(hello.models),
        loaded_models=list(hello.loaded_models),
        slots=hello.slots,
        hostname=hello.hostname,
        pid=hello.pid,
        version=hello.version,
        labels=dict(hello.labels),
        instance_id=hello.instance_id,
    )


def _model_to_proto(spec: ModelSpec) -> models_pb2.ModelSpec:
    hit = _MODELS.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    if len(_MODELS) >= _MODELS_MAX:  # specs made per call (not from a catalog): stay bounded
        _MODELS.clear()
    message = c.model_to_proto(spec)
    _MODELS[id(spec)] = (spec, message)
    return message


def assignment_to_proto(a: Assignment) -> pb.Assignment:
    return pb.Assignment(
        assignment_id=a.assignment_id,
        items=[
            pb.AssignmentItem(
                job_id=i.job_id,
                request=c.request_to_proto(i.request),
                attempt=i.attempt,
                queue_wait_ms=i.queue_wait_ms,
            )
            for i in a.items
        ],
        model=_model_to_proto(a.model),
        deadline_ms=a.deadline_ms,
        trace_context=a.trace_context,
        batch_group_id=a.batch_group_id,
    )


def outbound_to_proto(message: Outbound) -> pb.ConnectResponse:
    if isinstance(message, Assignment):
        return pb.ConnectResponse(assignment=assignment_to_proto(message))
    if isinstance(message, CancelAssignment):
        return pb.ConnectResponse(
            cancel=pb.CancelAssignment(
                assignment_id=message.assignment_id, job_id=message.job_id, reason=message.reason
            )
        )
    if isinstance(message, Drain):
        return pb.ConnectResponse(drain=pb.Drain(reason=message.reason))
    if isinstance(message, SessionOffer):
        offer: pb.ConnectResponse = message.message
        return offer
    if isinstance(message, LoadModel):
        return pb.ConnectResponse(
            load_model=pb.LoadModel(request_id=message.request_id, model=_model_to_proto(message.model))
        )
    if isinstance(message, UnloadModel):
        return pb.ConnectResponse(
            unload_model=pb.UnloadModel(
                request_id=message.request_id, model_id=message.model_id, deadline_ms=message.deadline_ms
            )
        )
    raise TypeError(f"not a worker message: {message!r}")


def model_answer_from_proto(answer: pb.ModelLoaded) -> WorkerAnswer:
    """A worker's ModelLoaded (the answer to a LoadModel or UnloadModel) as plain data."""
    error = None
    if not answer.ok:
        error = c.error_from_proto(answer.error)
        error.code = error.code or "UNKNOWN"
        error.message = error.message[:1000]  # quoted in a status message: bounded
    return WorkerAnswer(
        request_id=answer.request_id,
        model_id=answer.model_id,
        ok=answer.ok,
        error=error,
        load_ms=answer.load_ms,
        memory_bytes=answer.memory_bytes,
        unchanged=answer.unchanged,
    )


def accept_stored(message: types_pb2.GenerateResult, job_id: str, store: ArtifactStore | None) -> str:
    """Check the worker's artifact-store references and give clients their links (in place).

    An artifact with `object_uri` must name an object of this job in this controller's store;
    it gets the DownloadArtifact reference as `uri` and a presigned `url`. A worker never sets
    `url` itself. Returns "" or why the result cannot be taken (the job fails with it)."""
    for a in message.artifacts:
        a.ClearField("url")
        a.ClearField("url_expires_at_ms")
        if not a.object_uri:
            continue
        if store is None:
            return (
                f"the worker stored artifact {a.index} at {a.object_uri[:200]!r}, "
                "but this controller has no --artifact-store"
            )
        try:
            _, url, expires_ms = store.reference(job_id, a.object_uri)
        except ValueError as exc:
            return str(exc)
        a.ClearField("data")
        a.uri = artifact_reference(job_id, a.index)
        a.url = url
        a.url_expires_at_ms = expires_ms
    return ""


class WireResult:
    """A worker's result message as a `core.encoded.ResultEncoding` (opaque to the memory store)."""

    __slots__ = ("_message",)

    def __init__(self, message: types_pb2.GenerateResult) -> None:
        self._message = message

    def keeps(self, result: GenerateResult) -> bool:
        """True when `result` has every artifact of the message as it was (sizes, references)."""
        sent = self._message.artifacts
        return len(sent) == len(result.artifacts) and all(
            m.uri == a.uri and m.size_bytes == a.size_bytes
            for m, a in zip(sent, result.artifacts, strict=True)
        )

    def stamped(self, job_id: str, trace_id: str, tenant: str) -> bytes:
        """The message's bytes with the controller's ids (the message is the stream's, used once)."""
        message = self._message
        message.job_id = job_id
        message.report.trace_id = trace_id
        message.report.tenant = tenant
        return message.SerializeToString()


def generate_response(job: Job, encoded: EncodedJob | None) -> generation_pb2.GenerateResponse:
    """A final job's GenerateResponse: parsed from the store's bytes when it has them (straight
    into the answer's fields, no copy of the result between), else converted from `job`."""
    response = generation_pb2.GenerateResponse()
    if encoded is None:
        response.job.CopyFrom(c.job_to_proto(job, with_result=False))
        if job.result is not None:
            response.result.CopyFrom(c.result_to_proto(job.result))
        return response
    response.job.MergeFromString(encoded.job)
    if encoded.result is not None:
        response.result.MergeFromString(encoded.result)
    return response
