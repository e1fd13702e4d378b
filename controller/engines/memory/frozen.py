"""Finished jobs kept for reads as protobuf bytes, out of the garbage collector's way.

A finished job's record is a few dozen Python objects (the job, its result and report, every
event, the request). The in-memory store keeps up to `max_finished_jobs` of them, and Python's
full collections walk every one of them: with 10,000 kept jobs a full collection stopped the
controller for 100-250 ms on a 2-core machine, in the middle of everybody's calls. Frozen, a
kept job is one tuple of bytes and strings: the collector skips its contents. A read (GetJob,
WatchJob's replay, DownloadArtifact, an idempotent resubmit) thaws a fresh record from it.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from omnirt._internal import convert as c
from omnirt.controller.core.jobs import JobRecord
from omnirt.controller.core.validation import Plan
from omnirt.types import EventKind, GenerateResult, JobEvent, JobState, ModelSpec
from omnirt.v1 import types_pb2


class FinishedJob(NamedTuple):
    """A finished job as the store keeps it: what filters and evictions read, and the bytes."""

    id: str
    state: JobState
    model: str
    tenant: str
    idempotency_key: str
    fingerprint: bytes
    finished_at_monotonic: float
    spec: ModelSpec  # the catalog's, shared by every job of the model
    job: bytes  # omnirt.v1.Job without its result
    result: bytes | None  # omnirt.v1.GenerateResult as clients see it (None: the job has none)
    # omnirt.v1.GenerateResult with every artifact's bytes, when the job's result left some out.
    full_result: bytes
    request: bytes  # omnirt.v1.GenerateRequest
    # omnirt.v1.JobEvent each, in order; the RESULT event without its result (it is the job's).
    events: tuple[bytes, ...]


def freeze(record: JobRecord) -> FinishedJob:
    """The bytes of a finished record (it must not change any more)."""
    job = record.job
    result, full_result = _result_bytes(record)
    return FinishedJob(
        id=job.id,
        state=job.state,
        model=job.model,
        tenant=job.tenant,
        idempotency_key=job.idempotency_key,
        fingerprint=record.fingerprint,
        finished_at_monotonic=record.finished_at_monotonic,
        spec=record.plan.spec,
        job=c.job_to_proto(job, with_result=False).SerializeToString(),
        result=result,
        full_result=full_result,
        request=record.request_encoded or c.request_to_proto(record.plan.request).SerializeToString(),
        events=tuple(_event_bytes(e) for e in record.events),
    )


def _result_bytes(record: JobRecord) -> tuple[bytes | None, bytes]:
    """The client's view of the result, and the full result when an artifact was cut from the
    view (b"" else: only then does it differ): the worker's own bytes where they are that."""
    view, full, sent = record.job.result, record.result, record.result_encoded
    if view is None:
        return None, b""
    if not any(a.uri for a in view.artifacts):
        return (sent if sent is not None else _encode(view)), b""
    if full is None:
        return _encode(view), b""
    return _encode(view), (sent if sent is not None else _encode(full))


def _encode(result: GenerateResult) -> bytes:
    return c.result_to_proto(result).SerializeToString()


def _event_bytes(event: JobEvent) -> bytes:
    if event.kind is not EventKind.RESULT:
        return c.event_to_proto(event).SerializeToString()
    msg = c.event_to_proto(dataclasses.replace(event, result=None))
    msg.result.SetInParent()  # an empty result: the kind stays RESULT
    return msg.SerializeToString()


def thaw(entry: FinishedJob) -> JobRecord:
    """A new record with the finished job's contents."""
    job = c.job_from_proto(types_pb2.Job.FromString(entry.job))
    if entry.result is not None:
        job.result = c.result_from_proto(types_pb2.GenerateResult.FromString(entry.result))
    events = [c.event_from_proto(types_pb2.JobEvent.FromString(e)) for e in entry.events]
    for event in events:
        if event.kind is EventKind.RESULT:
            event.result = job.result
    full = (
        c.result_from_proto(types_pb2.GenerateResult.FromString(entry.full_result))
        if entry.full_result
        else job.result
    )
    request = c.request_from_proto(types_pb2.GenerateRequest.FromString(entry.request))
    return JobRecord(
        job=job,
        plan=Plan(spec=entry.spec, request=request),
        fingerprint=entry.fingerprint,
        request_encoded=entry.request,
        events=events,
        result=full,
        finished_at_monotonic=entry.finished_at_monotonic,
    )
