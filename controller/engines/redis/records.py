"""What the Redis job store hands out and takes in: plain records, read from Redis's answers."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import NamedTuple

from omnirt._internal import convert
from omnirt.controller.core.batching import split_queue
from omnirt.types import GenerateRequest, Job, JobEvent, JobState, Progress


class QuotaRefusal(Exception):
    """SUBMIT refused a job by its tenant's quota: `reason` is `tenants.REASON_*`; `active` the
    tenant's jobs queued or running (max_queued), `wait_s` the time until a token (rate)."""

    def __init__(self, reason: str, active: int = 0, wait_s: float = 0.0) -> None:
        super().__init__(reason)
        self.reason, self.active, self.wait_s = reason, active, wait_s


@dataclass
class RunEvents:
    """Events of one running job (from its worker, or its RUNNING state) not logged yet."""

    job_id: str
    assignment_id: str
    events: list[JobEvent] = field(default_factory=list)
    progress: Progress | None = None  # the newest, for GetJob
    worker: str = ""  # the worker running it, once known


def by_model(counts: dict[str, int]) -> dict[str, int]:
    """Counts by queue summed by model (a model's pinned queues into it)."""
    summed: dict[str, int] = {}
    for queue, n in counts.items():
        model = split_queue(queue)[0]
        summed[model] = summed.get(model, 0) + n
    return summed


@dataclass
class StoredJob:
    """A job as Redis holds it; its request is read from its bytes when asked for (a `Generate`
    that waits for the job never does)."""

    job: Job
    request_encoded: bytes
    fingerprint: bytes
    assignment: str
    owner: str
    enqueued_ms: int
    fields: dict[bytes, bytes]

    @functools.cached_property
    def request(self) -> GenerateRequest:
        return convert.request_from_bytes(self.request_encoded)


class Finished(NamedTuple):
    """What FINISH did: whether it changed the job, the state it had (None: unknown), its owner,
    assignment, and with `read_back` the job as it is now."""

    changed: bool
    before: JobState | None
    owner: str = ""
    assignment: str = ""
    job: StoredJob | None = None
