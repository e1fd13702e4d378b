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
from omnirt.types import EventKind, JobEvent, JobState, ModelSpec
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
    job: bytes  # omnirt.v1.Job, its result as clients see it
    # omnirt.v1.GenerateResult with every artifact's bytes, when the job's result left some out.
    full_result: bytes
    request: bytes  # omnirt.v1.GenerateRequest
    # omnirt.v1.JobEvent each, in order; the RESULT event without its result (it is the job's).
    events: tuple[bytes, ...]


def freeze(record: JobRecord) -> FinishedJob:
    """The bytes of a finished record (it must not change any more)."""
    job = record.job
    full = record.result
    # Only when an artifact was cut from the client's view does the full result differ from it.
    cut = job.result is not None and any(a.uri for a in job.result.artifacts)
    return FinishedJob(
        id=job.id,
        state=job.state,
        model=job.model,
        tenant=job.tenant,
        idempotency_key=job.idempotency_key,
        fingerprint=record.fingerprint,
        finished_at_monotonic=record.finished_at_monotonic,
        spec=record.plan.spec,
        job=_job_bytes(record),
        full_result=c.result_to_proto(full).SerializeToString() if full is not None and cut else b"",
        request=c.request_to_proto(record.plan.request).SerializeToString(),
        events=tuple(_event_bytes(e) for e in record.events),
    )


def _job_bytes(record: JobRecord) -> bytes:
    if record.result_message is None or record.job.result is None:
        return c.job_to_proto(record.job).SerializeToString()
    msg = c.job_to_proto(record.job, with_result=False)
    msg.result.CopyFrom(record.result_message)
    return msg.SerializeToString()


def _event_bytes(event: JobEvent) -> bytes:
    if event.kind is not EventKind.RESULT:
        return c.event_to_proto(event).SerializeToString()
    msg = c.event_to_proto(dataclasses.replace(event, result=None))
    msg.result.SetInParent()  # an empty result: the kind stays RESULT
    return msg.SerializeToString()


def thaw(entry: FinishedJob) -> JobRecord:
    """A new record with the finished job's contents."""
    job = c.job_from_proto(types_pb2.Job.FromString(entry.job))
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
        events=events,
        result=full,
        finished_at_monotonic=entry.finished_at_monotonic,
    )
