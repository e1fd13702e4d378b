"""OpenAI-compatible video jobs: `/v1/videos` over the job API (Submit, GetJob, Download, Cancel).

A video is a job: its id is the job id. Status: queued, in_progress (running), completed
(succeeded) or failed (failed or cancelled, with `error.code`). `seconds` becomes `num_frames`
at the request's `fps` or the model's default fps; an `input_reference` file makes the job an
image2video. `DELETE` cancels a queued or running job (`deleted` says whether it did); a
finished job's video stays downloadable until the job expires.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from omnirt._internal import convert as _convert
from omnirt.controller.edges.auth import caller
from omnirt.controller.http.errors import bad_request
from omnirt.controller.http.openai_params import INT32, Params, generate_request, read_params, sniff_image
from omnirt.controller.http.streams import send_download
from omnirt.controller.http.transcode import Gateway, build_request
from omnirt.types import GenerateRequest, Job, JobState, MediaInput, MediaRole, Task
from omnirt.v1 import generation_pb2

VIDEO_TASKS = (Task.TEXT2VIDEO, Task.IMAGE2VIDEO, Task.AUDIO2VIDEO)
STATUS = {JobState.QUEUED: "queued", JobState.RUNNING: "in_progress", JobState.SUCCEEDED: "completed"}
POLL_AFTER_MS = "500"
LIST_ALL = 1 << 30  # one ListJobs page holds every job the store keeps


def register(app: web.Application, gateway: Gateway) -> None:
    engine = gateway.engine

    # Every job is reached through the servicers (as the caller: another tenant's video is the
    # NOT_FOUND an unknown id gets); the request behind a job, which no RPC returns, is read
    # with the caller's scope, after GetJob has found the job the caller's.
    async def call(request: web.Request, rpc: str, path: dict[str, str], query: Any = None) -> Any:
        msg = build_request("", gateway.request_type(rpc), path, query or {}, None)
        return await gateway.call(rpc, msg, request)

    async def get(request: web.Request, job_id: str) -> Job:
        answer = await call(request, "GenerationService.GetJob", {"job_id": job_id})
        return _convert.job_from_proto(answer.job)

    async def video(job: Job) -> dict[str, Any]:
        req = await engine.request_of(job.id, tenant=caller().scope)
        return video_object(job, req, engine.config.job_ttl_s)

    async def create(request: web.Request) -> web.Response:
        params, files = await read_params(request, multipart=False)
        references = files.get("input_reference", [])
        req = generate_request(params, Task.IMAGE2VIDEO if references else Task.TEXT2VIDEO)
        if references:
            mime = sniff_image(references[0])
            if not mime:
                raise bad_request("not a PNG, JPEG, WEBP or GIF image", "input_reference")
            req.inputs = [MediaInput(MediaRole.IMAGE, data=references[0], mime_type=mime)]
        req.fps = params.number("fps")
        req.num_frames = params.integer("num_frames", minimum=1)
        seconds = params.number("seconds")
        if seconds is not None and seconds <= 0:
            raise bad_request(f"must be positive (got {seconds})", "seconds")
        if seconds and req.num_frames is None:
            fps = req.fps or engine.describe_model(req.model).defaults.fps
            if fps:
                req.num_frames = max(1, round(seconds * fps))
                if req.num_frames > INT32[1]:
                    raise bad_request(f"{seconds:g} s at {fps:g} fps is too many frames", "seconds")
        # Submit (the servicer) owns the job's tenant and the tenant's quotas.
        msg = generation_pb2.SubmitRequest(request=_convert.request_to_proto(req))
        answer = await gateway.call("GenerationService.Submit", msg, request)
        return web.json_response(
            await video(await get(request, answer.job.id)), headers={"openai-poll-after-ms": POLL_AFTER_MS}
        )

    async def retrieve(request: web.Request) -> web.Response:
        job = await get(request, request.match_info["video_id"])
        return web.json_response(await video(job), headers={"openai-poll-after-ms": POLL_AFTER_MS})

    async def listing(request: web.Request) -> web.Response:
        params = Params(request.query)
        limit = params.integer("limit", minimum=1, maximum=100) or 20
        order = params.choice("order", ("asc", "desc"), "desc")
        after = params.text("after")
        answer = await call(request, "GenerationService.ListJobs", {}, {"page_size": str(LIST_ALL)})
        jobs = [j for j in answer.jobs if _convert.task_from_proto(j.task) in VIDEO_TASKS]
        if order == "asc":
            jobs.reverse()
        if after:
            ids = [j.id for j in jobs]
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        page = jobs[:limit]
        return web.json_response(
            {
                "object": "list",
                "data": [await video(await get(request, j.id)) for j in page],
                "first_id": page[0].id if page else None,
                "last_id": page[-1].id if page else None,
                "has_more": len(jobs) > limit,
            }
        )

    async def content(request: web.Request) -> web.StreamResponse:
        params = Params(request.query)
        params.choice("variant", ("video",), "video")
        job_id = request.match_info["video_id"]
        msg = build_request(
            "",
            gateway.request_type("GenerationService.DownloadArtifact"),
            {"job_id": job_id, "index": "0"},
            {},
            None,
        )
        return await send_download(
            request, gateway.stream("GenerationService.DownloadArtifact", msg, request)
        )

    async def delete(request: web.Request) -> web.Response:
        answer = await call(
            request, "GenerationService.CancelJob", {"job_id": request.match_info["video_id"]}
        )
        return web.json_response(
            {"id": answer.job.id, "object": "video.deleted", "deleted": answer.cancelled}
        )

    app.router.add_post("/v1/videos", create, expect_handler=gateway.expect_continue)
    app.router.add_get("/v1/videos", listing)
    app.router.add_get("/v1/videos/{video_id}", retrieve)
    app.router.add_get("/v1/videos/{video_id}/content", content)
    app.router.add_delete("/v1/videos/{video_id}", delete)


def video_object(job: Job, req: GenerateRequest, ttl_s: float) -> dict[str, Any]:
    """OpenAI's `Video` for a job."""
    if job.state is JobState.SUCCEEDED:
        progress = 100
    elif job.progress and job.progress.total_steps:
        progress = min(99, int(100 * job.progress.step / job.progress.total_steps))
    else:
        progress = 0
    seconds = req.num_frames / req.fps if req.num_frames and req.fps else 0
    finished = int(job.finished_at.timestamp()) if job.finished_at else None
    body: dict[str, Any] = {
        "id": job.id,
        "object": "video",
        "model": job.model,
        "status": STATUS.get(job.state, "failed"),
        "progress": progress,
        "prompt": req.prompt,
        "created_at": int(job.created_at.timestamp()) if job.created_at else 0,
        "completed_at": finished,
        "expires_at": int(finished + ttl_s) if finished else None,
        "seconds": f"{seconds:g}",
        "size": f"{req.width}x{req.height}" if req.width and req.height else "",
        "remixed_from_video_id": None,
        "error": None,
    }
    if job.error is not None:
        body["error"] = {"code": job.error.code.lower(), "message": job.error.message}
    return body
