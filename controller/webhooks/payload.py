"""What a webhook delivery says: which job events become which webhook types, and the JSON body.

The body follows the Standard Webhooks shape: `{"type", "timestamp", "data"}`, with `data` the
job as the HTTP gateway renders it (`GET /v1/jobs/{id}`) at the time of the first attempt, and
every artifact as a link (`/v1/jobs/{id}/artifacts/{n}` on the gateway), never inline bytes.
`sequence` is the event's number in the job's event log (the order of a job's events).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from omnirt.controller.core.jobs import client_view
from omnirt.types import EventKind, Job, JobEvent, JobState, WebhookEvent

# A job as the HTTP gateway renders it, its artifact references as links of the gateway at the
# origin given: `http.transcode.job_json`, which the server hands the dispatcher (so webhooks
# import no HTTP module, and a payload's `data` cannot drift from `GET /v1/jobs/{id}`).
JobJson = Callable[[Job, str], dict[str, Any]]

STATE_EVENTS = {
    JobState.QUEUED: WebhookEvent.QUEUED,
    JobState.RUNNING: WebhookEvent.STARTED,
    JobState.SUCCEEDED: WebhookEvent.COMPLETED,
    JobState.FAILED: WebhookEvent.FAILED,
    JobState.CANCELLED: WebhookEvent.CANCELLED,
}


def webhook_event(event: JobEvent) -> WebhookEvent | None:
    """The webhook event a job event is, if any (stages, previews and logs are none)."""
    if event.kind is EventKind.STATE and event.state is not None:
        return STATE_EVENTS.get(event.state)
    if event.kind is EventKind.PROGRESS:
        return WebhookEvent.PROGRESS
    return None


def message_id(job_id: str, sequence: int) -> str:
    """The `webhook-id` of a job's event: the same on every attempt and on every controller."""
    return f"msg_{job_id}_{sequence}"


def body(kind: WebhookEvent, event: JobEvent, job: Job, origin: str, job_json: JobJson) -> bytes:
    """The JSON body of one delivery (`origin`: the gateway's base URL for artifact links, or "")."""
    if job.result is not None:
        job = replace(job, result=client_view(job.result, job.id, limit=0))  # every artifact a link
    data = job_json(job, origin)
    when = event.time or datetime.now(UTC)
    payload = {
        "type": f"job.{kind}",
        "timestamp": when.isoformat().replace("+00:00", "Z"),
        "sequence": event.sequence,
        "data": data,
    }
    return json.dumps(payload, separators=(",", ":")).encode()
