"""The encoded jobs and results of `core.encoded`: the worker's result kept as sent, a Generate
answered from the store's bytes.

(The worker protocol's own converter is shared with the worker: `omnirt._internal.protocol`.)
"""

from __future__ import annotations

from omnirt._internal import convert as c
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.encoded import EncodedJob
from omnirt.controller.core.jobs import artifact_reference
from omnirt.types import GenerateResult, Job
from omnirt.v1 import generation_pb2, types_pb2


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
