"""The in-memory job store: live records, and finished jobs frozen to bytes until they expire.

A finished job's record is a few dozen Python objects (the job, its result and report, every
event, the request). The store keeps up to `max_finished_jobs` of them, and Python's full
collections walk every one of them: with 10,000 kept jobs a full collection stopped the
controller for 100-250 ms on a 2-core machine, in the middle of everybody's calls. Frozen
(`FinishedJob`, below), a kept job is one tuple of bytes and strings: the collector skips its
contents. A read (GetJob, WatchJob's replay, DownloadArtifact, an idempotent resubmit) thaws a
fresh record from it.

It is also the memory engine's fast path (`core.encoded`): it keeps a worker's result bytes as
they came (`arriving`) and answers Generate from a frozen job's bytes (`encoded`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from omnirt._internal import convert as c
from omnirt.controller.core.encoded import EncodedJob, ResultEncoding
from omnirt.controller.core.jobs import JobRecord, utcnow
from omnirt.controller.core.validation import Plan
from omnirt.errors import JobNotFound
from omnirt.types import EventKind, GenerateResult, Job, JobError, JobEvent, JobState, ModelSpec
from omnirt.v1 import types_pb2


class JobStore:
    """In-memory jobs, newest last; finished jobs are evicted by count and age.

    A finished record is frozen (`FinishedJob`) by `freeze_finished`, which the engine
    calls once the job's waiters have been woken; reads of a frozen job get a fresh record.
    """

    def __init__(self, max_finished: int = 10000, ttl_s: float = 3600.0) -> None:
        self._jobs: OrderedDict[str, JobRecord | FinishedJob] = OrderedDict()
        # (tenant, idempotency key) -> job id: keys are scoped per tenant
        self._by_key: dict[tuple[str, str], str] = {}
        self._finished: OrderedDict[str, float] = OrderedDict()
        self.max_finished = max_finished
        self.ttl_s = ttl_s
        # Called with each evicted job's id (the artifact store deletes the job's objects).
        self.on_evict: Callable[[str], None] | None = None
        # The worker's result the engine takes now, as it came: (job id, assignment id, encoding).
        self._arriving: tuple[str, str, ResultEncoding] | None = None

    def watch_evictions(self, hook: Callable[[str], None]) -> None:
        """Call `hook` with the id of each job evicted from now on."""
        self.on_evict = hook

    def add(self, record: JobRecord) -> None:
        """Keep a new job, its resolved request encoded once (assignments and freezing reuse it)."""
        record.request_encoded = c.request_to_proto(record.plan.request).SerializeToString()
        self._jobs[record.job.id] = record
        if record.job.idempotency_key:
            self._by_key[record.job.tenant, record.job.idempotency_key] = record.job.id

    def get(self, job_id: str, tenant: str | None = None) -> JobRecord:
        """The job; with `tenant`, only when it is that tenant's (else the same JobNotFound as an
        unknown id: a caller learns nothing about other tenants' ids)."""
        entry = self._jobs.get(job_id)
        if entry is None or (tenant is not None and entry.tenant != tenant):
            raise JobNotFound(f"job {job_id!r} not found (unknown or expired)", field="job_id")
        return thaw(entry) if isinstance(entry, FinishedJob) else entry

    def by_idempotency_key(self, tenant: str, key: str) -> JobRecord | None:
        job_id = self._by_key.get((tenant, key))
        return self.get(job_id) if job_id and job_id in self._jobs else None

    def list(
        self,
        states: Iterable[JobState] = (),
        model: str = "",
        limit: int = 0,
        offset: int = 0,
        tenant: str | None = None,
    ) -> tuple[list[JobRecord], bool]:
        """Jobs newest first, filtered by state, model and tenant (None = any); a page of them and
        whether more follow.

        `limit` 0 means all after `offset`. Only the page's frozen jobs are thawed.
        """
        wanted = set(states)
        matching = [
            entry
            for entry in reversed(self._jobs.values())
            if (not wanted or entry.state in wanted)
            and (not model or entry.model == model)
            and (tenant is None or entry.tenant == tenant)
        ]
        end = offset + limit if limit else len(matching)
        page = [thaw(e) if isinstance(e, FinishedJob) else e for e in matching[offset:end]]
        return page, end < len(matching)

    def finish(
        self,
        record: JobRecord,
        state: JobState,
        *,
        error: JobError | None = None,
    ) -> None:
        """Move a job to a final state and log the closing events (result, then the state).

        For SUCCEEDED the caller sets `record.result` and `job.result` first.
        """
        job = record.job
        job.state = state
        job.finished_at = utcnow()
        job.error = error
        job.waiting_reason = ""
        job.queue_position = 0
        if state is JobState.SUCCEEDED and job.result is not None:
            record.result_encoded = self._as_sent(record) or record.result_encoded
            record.append(JobEvent(job_id=job.id, kind=EventKind.RESULT, result=job.result))
        record.append(
            JobEvent(job_id=job.id, kind=EventKind.STATE, state=state, error=error, worker_id=job.worker_id)
        )
        record.finished_at_monotonic = time.monotonic()
        self._finished[job.id] = record.finished_at_monotonic
        self.evict()

    @contextlib.contextmanager
    def arriving(self, job_id: str, assignment_id: str, encoding: ResultEncoding) -> Iterator[None]:
        """While the engine takes this worker's result (`core.encoded.ArrivingResults`): finishing
        the job with it keeps the result's bytes as they came (see `_as_sent`)."""
        self._arriving = (job_id, assignment_id, encoding)
        try:
            yield
        finally:
            self._arriving = None

    def _as_sent(self, record: JobRecord) -> bytes | None:
        """The record's result as the worker sent it, stamped with the controller's job id, trace
        id and tenant, when it is the result arriving now and has every artifact as it came."""
        if self._arriving is None:
            return None
        job_id, assignment_id, encoding = self._arriving
        result = record.result
        if job_id != record.job.id or assignment_id != record.assignment_id or result is None:
            return None
        if not encoding.keeps(result):
            return None
        return encoding.stamped(job_id, result.report.trace_id, result.report.tenant)

    def freeze_finished(self, job_id: str) -> None:
        """Keep a finished job as bytes from now on (no-op when it is gone or already frozen)."""
        entry = self._jobs.get(job_id)
        if isinstance(entry, JobRecord) and entry.job.state.terminal:
            self._jobs[job_id] = freeze(entry)

    def encoded(self, job: Job) -> EncodedJob | None:
        """A finished job's frozen bytes (`core.encoded.EncodedJobs`), freezing it now when it is
        not yet, so the conversion is made once for the answer and the store; None when it is
        evicted already, or not final (the edge converts `job` as it is)."""
        self.freeze_finished(job.id)
        entry = self._jobs.get(job.id)
        return EncodedJob(entry.job, entry.result) if isinstance(entry, FinishedJob) else None

    def evict(self, now: float | None = None) -> int:
        """Drop finished jobs past the TTL or beyond the count bound; returns how many."""
        now = time.monotonic() if now is None else now
        dropped = 0
        while self._finished:
            job_id, finished = next(iter(self._finished.items()))
            if len(self._finished) <= self.max_finished and now - finished < self.ttl_s:
                break
            self._finished.pop(job_id)
            entry = self._jobs.pop(job_id, None)
            if entry is not None and entry.idempotency_key:
                self._by_key.pop((entry.tenant, entry.idempotency_key), None)
            if self.on_evict is not None:
                self.on_evict(job_id)
            dropped += 1
        return dropped

    def __len__(self) -> int:
        return len(self._jobs)


# ---- finished jobs frozen to bytes ---------------------------------------------------------------


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
    request = c.request_from_bytes(entry.request)
    return JobRecord(
        job=job,
        plan=Plan(spec=entry.spec, request=request),
        fingerprint=entry.fingerprint,
        request_encoded=entry.request,
        events=events,
        result=full,
        finished_at_monotonic=entry.finished_at_monotonic,
    )
