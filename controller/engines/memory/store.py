"""The in-memory job store: live records, and finished jobs frozen to bytes until they expire.

It is also the memory engine's fast path (`core.encoded`): it keeps a worker's result bytes as
they came (`arriving`) and answers Generate from a frozen job's bytes (`encoded`).
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from omnirt._internal import convert as c
from omnirt.controller.core.encoded import EncodedJob, ResultEncoding
from omnirt.controller.core.jobs import JobRecord, utcnow
from omnirt.controller.engines.memory.frozen import FinishedJob, freeze, thaw
from omnirt.errors import JobNotFound
from omnirt.types import EventKind, Job, JobError, JobEvent, JobState


class JobStore:
    """In-memory jobs, newest last; finished jobs are evicted by count and age.

    A finished record is frozen (`frozen.FinishedJob`) by `freeze_finished`, which the engine
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
