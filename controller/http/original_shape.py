"""The original OmniRT's request and answer shapes at the HTTP edge (docs/http.md, "The original
OmniRT's request shape").

`POST /v1/generate` with the original's body (`is_original`: `inputs` as an object, `config`,
`backend` or `async_run`) comes here: translated once by `omnirt._internal.original`, its
`backend` checked against the connected workers, the job labelled `omnirt.shape=original`
(labels persist in both job stores), and answered as the original answered. The shaped routes
(`transcode.Route.shaped`) then answer such a job in that shape wherever it is read;
`?shape=omnirt` (or `X-Omnirt-Shape: omnirt`) asks for ours, `?shape=original` for the
original's for any job. `GET /v1/jobs/{id}/trace` is the original's trace view.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from omnirt._internal import convert as c
from omnirt._internal.original import (
    SHAPE_LABEL,
    SHAPE_ORIGINAL,
    error_to_original,
    event_to_original,
    job_to_original,
    request_from_original,
    result_to_original,
    trace_to_original,
)
from omnirt.controller.core.bounds import shown
from omnirt.controller.http.errors import bad_request
from omnirt.controller.http.transcode import (
    ASYNC_KEY,
    SHAPE_KEY,
    Gateway,
    artifact_links,
    artifact_url,
    flag,
    to_json,
)
from omnirt.controller.observability.tracing import trace_id_of
from omnirt.errors import FailedPrecondition, InvalidRequest, OmniRTError
from omnirt.types import ModelSpec, WorkerInfo, WorkerState
from omnirt.v1 import generation_pb2  # the edge builds its own request messages, like a servicer

OMNIRT, ORIGINAL = "omnirt", "original"
SHAPE_HEADER = "X-Omnirt-Shape"
ASYNC_RUN = "async_run"
# A live job's trace holds the events that arrive within this long (its log is replayed at once;
# the stream would otherwise wait for the job to end).
LIVE_EVENTS_S = 0.05
UrlOf = Callable[[Any], str]


def wanted_shape(request: web.Request) -> str:
    """The shape the client asks for: `omnirt`, `original`, or "" (the job's own)."""
    if SHAPE_KEY in request.query:
        value, field = request.query[SHAPE_KEY], SHAPE_KEY
    else:
        value, field = request.headers.get(SHAPE_HEADER, ""), SHAPE_HEADER
    value = value.strip().lower()
    if value not in ("", OMNIRT, ORIGINAL):
        raise bad_request(f"must be {OMNIRT} or {ORIGINAL} (got {shown(value)})", field)
    return value


def is_original_job(job: Any, shape: str) -> bool:
    """Whether a job (a `Job` message) is answered in the original's shape."""
    if shape:
        return shape == ORIGINAL
    return bool(job.labels.get(SHAPE_LABEL) == SHAPE_ORIGINAL)


def url_of(request: web.Request, job_id: str) -> UrlOf:
    """An artifact's URL on this gateway, for the original's `outputs[i].path` and `url`."""
    return lambda artifact: artifact_url(request, job_id, artifact.index)


def record_of(request: web.Request, job_msg: Any, original_request: Any = None) -> dict[str, Any]:
    """A `Job` message as the original's job record."""
    job = c.job_from_proto(job_msg)
    return job_to_original(job, url_of(request, job.id), original_request, trace_id_of(job.id))


# ---- POST /v1/generate ---------------------------------------------------------------------


async def generate(gateway: Gateway, request: web.Request, body: dict[str, Any], shape: str) -> web.Response:
    """The original's request: its result (sync) or its job record (`async_run`), as the original
    answered both (200); with `?shape=omnirt`, our GenerateResponse or SubmitResponse (202)."""
    wants_async = body.pop(ASYNC_RUN, False)
    if not isinstance(wants_async, bool):
        message = f"{ASYNC_RUN}: must be true or false (got {shown(wants_async)})"
        raise InvalidRequest(message, field=ASYNC_RUN)
    wants_async = wants_async or flag(request.query.get(ASYNC_KEY, ""))
    req, backend = request_from_original(body)
    if backend:
        await check_backend(gateway, req.model, str(body.get("backend")), backend)
    req.labels[SHAPE_LABEL] = SHAPE_ORIGINAL
    try:
        return await _run(gateway, request, c.request_to_proto(req), wants_async, body, shape)
    except OmniRTError as error:  # the controller's or a worker's field, as the client wrote it
        error_to_original(error, body)
        raise


async def _run(
    gateway: Gateway, request: web.Request, msg: Any, wants_async: bool, body: dict[str, Any], shape: str
) -> web.Response:
    origin = str(request.url.origin())
    if wants_async:
        submitted = await gateway.call(
            "GenerationService.Submit", generation_pb2.SubmitRequest(request=msg), request
        )
        headers = {"Location": f"/v1/jobs/{submitted.job.id}"}
        if shape == OMNIRT:
            return web.json_response(artifact_links(to_json(submitted), origin), status=202, headers=headers)
        return web.json_response(record_of(request, submitted.job, body), headers=headers)
    answer = await gateway.call("GenerationService.Generate", msg, request)
    if shape == OMNIRT:
        return web.json_response(artifact_links(to_json(answer), origin))
    result = c.result_from_proto(answer.result)
    return web.json_response(result_to_original(result, url_of(request, answer.job.id)))


async def check_backend(gateway: Gateway, model: str, asked: str, backend: str) -> None:
    """FailedPrecondition naming `backend` unless a connected worker of `backend` serves `model`.

    The job is then pinned to that backend (the label `omnirt.backend`, which the translation
    set): the scheduler gives it to that backend's workers only (docs/controller.md). This
    check refuses at once what the original refused at once, whatever `--unserved-wait-s` is.
    """
    spec = gateway.engine.describe_model(model)  # ModelNotFound first, as the servicer would
    serving = [w for w in await gateway.engine.list_workers() if _serves(w, spec)]
    if any(w.backend == backend for w in serving):
        return
    have = ", ".join(sorted({w.backend for w in serving})) or "none connected"
    raise FailedPrecondition(
        f"backend: {asked!r} needs a connected worker of backend {backend} serving {spec.id!r}, and "
        f'none is (the backends serving it: {have}); "auto" takes any',
        field="backend",
    )


def _serves(worker: WorkerInfo, spec: ModelSpec) -> bool:
    """The router's rule (`WorkerHandle.serves`), on a listed worker: its mode, its models, ready."""
    listed = not worker.models or spec.id in worker.models
    return worker.state is WorkerState.READY and worker.execution_mode == spec.execution_mode and listed


# ---- the job routes ------------------------------------------------------------------------


def answer(request: web.Request, rpc: str, response: Any, shape: str) -> web.Response | None:
    """A shaped route's answer in the original's shape, or None for ours."""
    if rpc.endswith(".Generate"):
        if shape != ORIGINAL:
            return None
        result = c.result_from_proto(response.result)
        return web.json_response(result_to_original(result, url_of(request, response.job.id)))
    if not is_original_job(response.job, shape):
        return None
    return web.json_response(record_of(request, response.job))


async def streams_original(gateway: Gateway, request: web.Request, shape: str) -> bool:
    """Whether a job's event stream is in the original's shape (its job is read when not asked)."""
    if shape:
        return shape == ORIGINAL
    msg = generation_pb2.GetJobRequest(job_id=request.match_info["job_id"])
    found = await gateway.call("GenerationService.GetJob", msg, request)  # 404 before any stream
    return is_original_job(found.job, "")


def sse_event(event: Any) -> tuple[str, dict[str, Any]] | None:
    """A JobEvent message as the original's SSE event: `event: NAME`, data its record."""
    record = event_to_original(c.event_from_proto(event))
    return None if record is None else (record["event"], record)


def ws_frame(event: Any) -> dict[str, Any] | None:
    """A JobEvent message as the original's WebSocket frame: the bare event record."""
    return event_to_original(c.event_from_proto(event))


def ws_commands(
    gateway: Gateway, request: web.Request
) -> dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]]:
    """The original's one WebSocket command, `{"action": "cancel"}`, answered with its ack."""
    job_id = request.match_info["job_id"]

    async def cancel(_: dict[str, Any]) -> dict[str, Any]:
        msg = generation_pb2.CancelJobRequest(job_id=job_id)
        done = await gateway.call("GenerationService.CancelJob", msg, request)
        return {
            "event": "control_ack",
            "stage": "job",
            "timestamp_ms": int(time.time() * 1000),
            "data": {"job_id": job_id, "cancelled": bool(done.cancelled)},
        }

    return {"cancel": cancel}


def register(app: web.Application, gateway: Gateway) -> None:
    """`GET /v1/jobs/{job_id}/trace`: the original's trace record of any job."""

    async def trace(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        get = generation_pb2.GetJobRequest(job_id=job_id)
        job = c.job_from_proto((await gateway.call("GenerationService.GetJob", get, request)).job)
        window = None if job.state.terminal else LIVE_EVENTS_S  # a final job's stream ends by itself
        events = []
        watch = generation_pb2.WatchJobRequest(job_id=job_id)
        stream = gateway.stream("GenerationService.WatchJob", watch, request)
        try:
            while True:
                try:
                    item = await asyncio.wait_for(anext(stream), window)
                except (StopAsyncIteration, TimeoutError):
                    break
                events.append(c.event_from_proto(item.event))
        finally:
            await stream.aclose()
        return web.json_response(trace_to_original(job, events, trace_id_of(job_id)))

    app.router.add_get("/v1/jobs/{job_id}/trace", trace)
