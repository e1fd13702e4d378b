"""The HTTP edge through real daemons: the JSON gateway, SSE and WebSocket streams, OpenAI routes.

One controller with `--http` and one worker for the module; the `null` model (no compute) for
the control-plane routes, the tiny Stable Diffusion for the OpenAI images client.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from PIL import Image

from tests.conftest import QUEUED_VIDEO, USER_CATALOG
from tests.daemons import Controller, Worker

# A text2video model run by the null pipeline: jobs run through the whole protocol (and can
# be cancelled mid-run); they fail at export, the null pipeline writes no video.
VIDEO_CATALOG = (
    """
[[models]]
id = "null-video"
family = "null"
tasks = ["text2video", "image2video"]
execution_mode = "legacy_call"
source = "builtin:null"
pipeline_class = "NullPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
fps = 8

"""
    + QUEUED_VIDEO
)
MAX_BODY = 256 * 1024
# The openai client marks its videos API deprecated (OpenAI's service is being retired); the
# routes and the client's shapes stay what this gateway implements.
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")
MAX_QUEUE = 4


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "user.toml"
    catalog.write_text(USER_CATALOG + VIDEO_CATALOG)
    daemon = Controller(
        log_dir,
        "--catalog", str(catalog),
        "--http-max-body-bytes", str(MAX_BODY),
        "--max-queue", str(MAX_QUEUE),
        http=True,
    ).start()  # fmt: skip
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=60) as client:
        yield client


def png_bytes(size: tuple[int, int] = (64, 64), colour: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def wait_state(http: httpx.Client, job_id: str, states: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = http.get(f"/v1/jobs/{job_id}").json()["job"]
        if job["state"] in states or time.monotonic() > deadline:
            return job  # type: ignore[no-any-return]
        time.sleep(0.05)


def assert_error(response: httpx.Response, status: int, code: str, field: str = "") -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == code, error
    if field:
        assert error["field"] == field, error
    return error  # type: ignore[no-any-return]


# ---- the JSON gateway --------------------------------------------------------------------


def test_generate_returns_the_result_with_the_image_inline(http: httpx.Client) -> None:
    r = http.post("/v1/generate", json={"model": "null", "prompt": "a cat", "seed": 7, "num_outputs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"]["state"] == "JOB_STATE_SUCCEEDED"
    artifacts = body["result"]["artifacts"]
    assert [a["seed"] for a in artifacts] == ["7", "8"]  # int64 is a string in proto JSON
    data = base64.b64decode(artifacts[0]["data"])
    assert hashlib.sha256(data).hexdigest() == artifacts[0]["sha256"]
    assert Image.open(io.BytesIO(data)).format == "PNG"
    report = body["result"]["report"]
    assert report["schema_version"] == "1.0.0" and report["worker_id"] == "w-main"
    assert len(report["trace_id"]) == 32


def test_async_generate_returns_the_job_and_jobs_can_be_listed(http: httpx.Client) -> None:
    r = http.post(
        "/v1/generate", json={"model": "null", "prompt": "later", "async": True, "labels": {"t": "1"}}
    )
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] in ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING")
    done = wait_state(http, job["id"], {"JOB_STATE_SUCCEEDED"})
    assert done["state"] == "JOB_STATE_SUCCEEDED" and done["labels"] == {"t": "1"}
    # enums by short name, repeated query keys, camelCase or proto names
    listed = http.get("/v1/jobs", params={"states": "succeeded", "model": "null", "pageSize": 100}).json()
    assert job["id"] in [j["id"] for j in listed["jobs"]]
    assert all(j["state"] == "JOB_STATE_SUCCEEDED" for j in listed["jobs"])
    page = http.get("/v1/jobs", params={"page_size": 1}).json()
    assert len(page["jobs"]) == 1 and page["next_page_token"]
    # POST /v1/jobs is Submit too
    r = http.post("/v1/jobs", json={"model": "null", "prompt": "p", "task": "text2image"})
    assert r.status_code == 202 and r.json()["job"]["task"] == "TASK_TEXT2IMAGE"


def test_validate_models_and_workers(http: httpx.Client) -> None:
    plan = http.post("/v1/validate", json={"model": "tiny-stable-diffusion", "prompt": "x", "preset": "fast"})
    assert plan.status_code == 200, plan.text
    body = plan.json()
    assert (body["model"], body["task"], body["execution_mode"]) == (
        "tiny-sd",
        "TASK_TEXT2IMAGE",
        "legacy_call",
    )
    assert body["config_resolved"]["num_inference_steps"] == 2
    # Integral numbers print as integers (a Struct holds doubles), fractions as they are.
    assert re.search(r'"num_inference_steps": ?2[,}]', plan.text), plan.text
    models = {m["id"]: m for m in http.get("/v1/omnirt/models").json()["models"]}
    assert {"tiny-sd", "null", "unserved-sd", "null-video"} <= set(models)
    assert models["unserved-sd"]["serving_workers"] == 0 and models["null"]["serving_workers"] == 1
    video = http.get("/v1/omnirt/models", params={"task": "text2video"}).json()["models"]
    assert "null-video" in {m["id"] for m in video} and "tiny-sd" not in {m["id"] for m in video}
    assert http.get("/v1/omnirt/models/tiny-stable-diffusion").json()["model"]["id"] == "tiny-sd"
    error = assert_error(http.get("/v1/omnirt/models/tiny-sdd"), 404, "NOT_FOUND")
    assert error["subject"] == "model" and "did you mean tiny-sd" in error["message"]
    (worker,) = [w for w in http.get("/v1/workers").json()["workers"] if w["id"] == "w-main"]
    assert worker["execution_mode"] == "legacy_call" and worker["slots"] == 1
    assert_error(http.post("/v1/workers/nobody/drain"), 404, "NOT_FOUND")


def test_an_oversized_artifact_goes_by_url_and_streams(http: httpx.Client) -> None:
    r = http.post(
        "/v1/generate",
        json={"model": "null", "prompt": "big", "seed": 3, "output": {"inline_limit_bytes": 1}},
    )
    artifact = r.json()["result"]["artifacts"][0]
    assert artifact["data"] == ""
    job_id = r.json()["job"]["id"]
    assert artifact["uri"] == f"{http.base_url}".rstrip("/") + f"/v1/jobs/{job_id}/artifacts/0"
    download = http.get(artifact["uri"])
    assert download.status_code == 200 and download.headers["content-type"] == "image/png"
    assert hashlib.sha256(download.content).hexdigest() == artifact["sha256"]
    assert_error(http.get(f"/v1/jobs/{job_id}/artifacts/5"), 400, "INVALID_ARGUMENT", "index")
    assert_error(http.get(f"/v1/jobs/{job_id}/artifacts/x"), 400, "INVALID_ARGUMENT", "index")


def test_cancel_a_queued_job(http: httpx.Client) -> None:
    job = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "never"}).json()["job"]
    seen = http.get(f"/v1/jobs/{job['id']}").json()["job"]
    assert "no connected worker serves model unserved-sd" in seen["waiting_reason"]
    first = http.delete(f"/v1/jobs/{job['id']}").json()
    assert first["cancelled"] is True and first["job"]["state"] == "JOB_STATE_CANCELLED"
    assert http.delete(f"/v1/jobs/{job['id']}").json()["cancelled"] is False


@pytest.mark.parametrize(
    ("body", "status", "code", "field"),
    [
        ({"model": "null", "prompt": "x", "width": 60}, 400, "INVALID_ARGUMENT", "width"),
        ({"model": "null", "prompt": ""}, 400, "INVALID_ARGUMENT", "prompt"),
        ({"model": "null", "prompt": "x", "task": "text2audio"}, 400, "INVALID_ARGUMENT", "task"),
        ({"model": "null", "prompt": "x", "task": "painting"}, 400, "INVALID_ARGUMENT", "task"),
        ({"model": "null", "prompt": "x", "width": "wide"}, 400, "INVALID_ARGUMENT", "width"),
        ({"model": "null", "prompt": "x", "colour": "red"}, 400, "INVALID_ARGUMENT", "colour"),
        ({"model": "null", "prompt": "x", "async": "maybe"}, 400, "INVALID_ARGUMENT", "async"),
        ({"model": "tiny-sdd", "prompt": "x"}, 404, "NOT_FOUND", "model"),
        ({"model": "broken-sd", "prompt": "x"}, 400, "FAILED_PRECONDITION", ""),
    ],
)
def test_bad_requests_get_json_errors(
    http: httpx.Client, body: dict[str, Any], status: int, code: str, field: str
) -> None:
    assert_error(http.post("/v1/generate", json=body), status, code, field)


def test_bad_http_gets_a_4xx_and_the_gateway_keeps_serving(
    http: httpx.Client, controller: Controller
) -> None:
    headers = {"content-type": "application/json"}
    assert (
        "malformed JSON"
        in assert_error(
            http.post("/v1/generate", content=b"{not json", headers=headers), 400, "INVALID_ARGUMENT"
        )["message"]
    )
    assert_error(http.post("/v1/generate", content=b"[1, 2]", headers=headers), 400, "INVALID_ARGUMENT")
    text = {"content-type": "text/plain"}
    assert_error(http.post("/v1/generate", content=b"model=null", headers=text), 415, "INVALID_ARGUMENT")
    huge = json.dumps({"model": "null", "prompt": "x" * (MAX_BODY + 10)})
    assert_error(http.post("/v1/generate", content=huge, headers=headers), 413, "INVALID_ARGUMENT")
    assert_error(http.get("/v1/nowhere"), 404, "NOT_FOUND")
    assert_error(http.put("/v1/jobs"), 405, "UNIMPLEMENTED")
    assert_error(http.get("/v1/jobs", params={"colour": "red"}), 400, "INVALID_ARGUMENT", "colour")
    assert_error(http.get("/v1/jobs/job-nope"), 404, "NOT_FOUND", "job_id")
    assert_error(http.get("/v1/jobs/job-nope/events"), 404, "NOT_FOUND")
    assert_error(http.delete("/v1/jobs/job-nope"), 404, "NOT_FOUND")
    assert controller.alive()
    assert http.get("/healthz").json()["status"] == "SERVING"
    assert http.post("/v1/generate", json={"model": "null", "prompt": "still here"}).status_code == 200


def test_a_full_queue_answers_429_with_retry_after(http: httpx.Client) -> None:
    ids = []
    try:
        for _ in range(MAX_QUEUE + 1):
            r = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "wait"})
            if r.status_code != 202:
                break
            ids.append(r.json()["job"]["id"])
        error = assert_error(r, 429, "RESOURCE_EXHAUSTED")
        assert int(r.headers["retry-after"]) >= 1 and error["retry_after_ms"] >= 1
    finally:
        for job_id in ids:
            http.delete(f"/v1/jobs/{job_id}")


def test_a_deadline_in_the_queue_is_504(http: httpx.Client) -> None:
    started = time.monotonic()
    r = http.post("/v1/generate", json={"model": "unserved-sd", "prompt": "late", "timeout_ms": 300})
    assert_error(r, 504, "DEADLINE_EXCEEDED")
    assert time.monotonic() - started < 10


# ---- event streams -----------------------------------------------------------------------


def read_sse(response: httpx.Response) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if current:
                events.append(current)
            current = {}
        elif not line.startswith(":"):
            key, _, value = line.partition(": ")
            current[key] = value
    return events


def test_sse_streams_every_event_to_the_end(http: httpx.Client) -> None:
    job = http.post("/v1/jobs", json={"model": "null", "prompt": "p", "num_inference_steps": 3}).json()["job"]
    with http.stream("GET", f"/v1/jobs/{job['id']}/events") as r:
        assert r.headers["content-type"] == "text/event-stream"
        events = read_sse(r)  # returns only once the server ends the stream
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    data = [json.loads(e["data"]) for e in events]
    states = [d["state_change"]["state"] for d in data if "state_change" in d]
    assert states == ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"]
    assert [d["progress"]["step"] for d in data if "progress" in d] == [1, 2, 3]
    assert {"stage", "progress", "result", "state_change"} <= {e["event"] for e in events}
    assert events[-2]["event"] == "result" and data[-2]["result"]["job_id"] == job["id"]
    # resume after a sequence number; past the end there is nothing (204 stops an EventSource)
    with http.stream(
        "GET", f"/v1/jobs/{job['id']}/events", headers={"Last-Event-ID": str(len(events) - 1)}
    ) as r:
        assert [int(e["id"]) for e in read_sse(r)] == [len(events)]
    assert http.get(f"/v1/jobs/{job['id']}/events", params={"after_sequence": len(events)}).status_code == 204


def test_websocket_streams_events_takes_a_cancel_and_survives_bad_messages(http: httpx.Client) -> None:
    job = http.post(
        "/v1/jobs",
        json={
            "model": "null",
            "prompt": "slow",
            "num_inference_steps": 200,
            "extra": {"sleep_ms_per_step": 50},
        },
    ).json()["job"]
    url = str(http.base_url).replace("http", "ws", 1).rstrip("/")

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
        events: list[dict[str, Any]] = []
        replies: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await session.ws_connect(f"{url}/v1/jobs/job-nope/stream")
            assert info.value.status == 404
            async with session.ws_connect(f"{url}/v1/jobs/{job['id']}/stream") as ws:
                sent = False
                async for frame in ws:
                    message = json.loads(frame.data)
                    if "event" in message:
                        events.append(message["event"])
                        if "progress" in message["event"] and not sent:
                            sent = True
                            await ws.send_str("not json")
                            await ws.send_json({"type": "bogus"})
                            await ws.send_bytes(b"\x00")
                            await ws.send_json({"type": "cancel"})
                    else:
                        replies.append(message)
                return events, replies, ws.close_code

    events, replies, close_code = asyncio.run(run())
    errors = [r["error"] for r in replies if "error" in r]
    assert len(errors) == 3 and all(e["code"] == "INVALID_ARGUMENT" for e in errors)
    assert "unknown message type 'bogus'" in errors[1]["message"]
    (cancel,) = [r["cancel"] for r in replies if "cancel" in r]
    assert cancel["cancelled"] is True and cancel["job"]["state"] == "JOB_STATE_CANCELLED"
    states = [e["state_change"]["state"] for e in events if "state_change" in e]
    assert states[-1] == "JOB_STATE_CANCELLED" and "JOB_STATE_RUNNING" in states
    assert len([e for e in events if "progress" in e]) < 200, "the job stopped early"
    assert close_code == 1000
    assert wait_state(http, job["id"], {"JOB_STATE_CANCELLED"})["state"] == "JOB_STATE_CANCELLED"


# ---- OpenAI-compatible routes ------------------------------------------------------------


@pytest.fixture(scope="module")
def oai(controller: Controller, worker: Worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=controller.http + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_openai_client_generates_images_as_b64_and_url(oai: openai.OpenAI, http: httpx.Client) -> None:
    extra = {"seed": 42, "num_inference_steps": 2, "guidance_scale": 5.0, "negative_prompt": "blur"}
    first = oai.images.generate(model="tiny-sd", prompt="a lighthouse", size="64x64", extra_body=extra)
    again = oai.images.generate(
        model="tiny-sd", prompt="a lighthouse", size="64x64", response_format="url", extra_body=extra
    )
    pair = oai.images.generate(model="tiny-sd", prompt="a lighthouse", n=2, extra_body=extra)
    assert first.data is not None and len(first.data) == 1 and first.created > 0
    a = base64.b64decode(first.data[0].b64_json or "")
    image = Image.open(io.BytesIO(a))
    assert image.format == "PNG" and image.size == (64, 64)
    assert pair.data is not None and len(pair.data) == 2
    assert pair.data[0].b64_json != pair.data[1].b64_json, "seed + i per output"
    assert again.data is not None and again.data[0].url
    assert http.get(again.data[0].url).content == a, "the same seed gives the same image"


def test_openai_errors_have_openai_shape(oai: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        oai.images.generate(model="dall-e-3", prompt="x")
    assert missing.value.code == "model_not_found" and missing.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad:
        oai.images.generate(model="null", prompt="x", size="big")
    assert bad.value.param == "size"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.images.generate(model="null", prompt="x", size="60x64")
    assert bad.value.param == "width" and bad.value.code == "invalid_argument"
    r = http.post("/v1/images/generations", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert set(http.get("/v1/images/nothing").json()["error"]) == {"message", "type", "param", "code"}


def test_openai_edits_run_image2image_and_inpaint(oai: openai.OpenAI, http: httpx.Client) -> None:
    image, mask = png_bytes(), png_bytes(colour=(255, 255, 255))
    edited = oai.images.edit(
        model="null", image=("in.png", image), prompt="make it blue", extra_body={"seed": 5}
    )
    assert (
        edited.data
        and Image.open(io.BytesIO(base64.b64decode(edited.data[0].b64_json or ""))).format == "PNG"
    )
    inpainted = oai.images.edit(
        model="null", image=("in.png", image), mask=("mask.png", mask), prompt="a hole", response_format="url"
    )
    assert inpainted.data and inpainted.data[0].url
    job_id = inpainted.data[0].url.split("/jobs/")[1].split("/")[0]
    assert http.get(f"/v1/jobs/{job_id}").json()["job"]["task"] == "TASK_INPAINT"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.images.edit(model="null", image=("in.txt", b"not an image"), prompt="x")
    assert bad.value.param == "image"
    r = http.post("/v1/images/edits", data={"model": "null", "prompt": "x"}, files={"mask": ("m.png", mask)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "image"
    r = http.post("/v1/images/edits", json={"model": "null", "prompt": "x"})
    assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
    # a real pipeline: tiny-sd's image2image
    real = oai.images.edit(model="tiny-sd", image=("in.png", image), prompt="x", extra_body={"strength": 0.5})
    assert real.data
    assert Image.open(io.BytesIO(base64.b64decode(real.data[0].b64_json or ""))).size == (64, 64)


def test_openai_video_jobs_lifecycle_and_cancel(oai: openai.OpenAI, http: httpx.Client) -> None:
    video = oai.videos.create(model="null-video", prompt="a wave", seconds="4", size="64x64")  # type: ignore[arg-type]
    assert (
        video.object == "video" and video.status in ("queued", "in_progress") and video.model == "null-video"
    )
    assert (video.seconds, video.size) == ("4", "64x64")
    job = http.get(f"/v1/jobs/{video.id}").json()["job"]
    assert job["task"] == "TASK_TEXT2VIDEO"
    done = oai.videos.poll(video.id, poll_interval_ms=50)
    assert done.completed_at and done.expires_at and done.expires_at > done.completed_at
    # the null pipeline writes no video: the job runs end to end and fails at export
    assert done.status == "failed" and done.error is not None and done.error.code == "invalid_argument"
    with pytest.raises(openai.BadRequestError):
        oai.videos.download_content(video.id)
    # A job that waits in the queue (no worker runs its mode): a null-video job would fail at
    # planning within a millisecond of its dispatch, before a delete could reach it.
    slow = oai.videos.create(model="queued-video", prompt="slow")
    deleted = oai.videos.delete(slow.id)
    assert deleted.deleted is True and deleted.object == "video.deleted"
    cancelled = oai.videos.retrieve(slow.id)
    assert (
        cancelled.status == "failed" and cancelled.error is not None and cancelled.error.code == "cancelled"
    )
    assert oai.videos.delete(slow.id).deleted is False
    listed = [v.id for v in oai.videos.list(limit=10)]
    assert slow.id in listed and video.id in listed
    with pytest.raises(openai.NotFoundError):
        oai.videos.retrieve("job-nope")
    with pytest.raises(openai.BadRequestError) as bad:
        oai.videos.create(model="tiny-sd", prompt="x")
    assert bad.value.param == "task"


def test_openai_video_of_a_real_pipeline_downloads_as_mp4(oai: openai.OpenAI, http: httpx.Client) -> None:
    av = pytest.importorskip("av")  # a [worker] dependency: present wherever the worker runs
    video = oai.videos.create(model="tiny-wan", prompt="a wave", seconds="1", size="64x64")  # type: ignore[arg-type]
    done = oai.videos.poll(video.id, poll_interval_ms=50)
    assert done.status == "completed", done.error
    content = oai.videos.download_content(video.id).content
    assert content == http.get(f"/v1/videos/{video.id}/content").content
    with av.open(io.BytesIO(content)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    # 1 s at tiny-wan's 8 fps is 8 frames; Wan needs 4k+1, so the pipeline makes 9
    assert len(frames) == 9 and frames[0].shape[:2] == (64, 64)
