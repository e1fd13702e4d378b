"""The original OmniRT's request shape on `POST /v1/generate`, through real daemons.

The requests are the original's own documented examples (tests/fixtures/original/: its Service
Schema page, its HTTP server page and its text2image guide), at tiny sizes; the test's catalog
maps the original's model ids to the tiny offline models. One controller (memory store) with a
worker, and two controllers on one Redis with a worker on the first: a job submitted in the
original's shape reads back in it from the other controller too.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator
from PIL import Image

from tests.conftest import USER_CATALOG
from tests.daemons import Controller, RedisServer, Worker

FIXTURES = Path(__file__).parent.parent / "fixtures" / "original"
STAND_INS = (Path(__file__).resolve().parents[1] / "fixtures" / "original" / "stand_ins.toml").read_text()
FINAL = {"succeeded", "failed", "cancelled"}


def fixture(name: str) -> dict[str, Any]:
    text = (FIXTURES / name).read_text()
    data = yaml.safe_load(text) if name.endswith(".yaml") else json.loads(text)
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "user.toml"
    path.write_text(USER_CATALOG + STAND_INS)
    return path


@pytest.fixture(scope="module")
def controller(log_dir: Path, catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=60) as client:
        yield client


def wait_final(http: httpx.Client, job_id: str, timeout: float = 60) -> dict[str, Any]:
    """The job in the original's shape, once final; every state on the way is lowercase."""
    deadline = time.monotonic() + timeout
    while True:
        r = http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        job: dict[str, Any] = r.json()
        assert job["id"] == job_id and job["state"] in {"queued", "running", *FINAL}, job
        if job["state"] in FINAL or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


def assert_png_at(http: httpx.Client, output: dict[str, Any], size: tuple[int, int]) -> None:
    assert output["kind"] == "image" and output["mime"] == "image/png", output
    assert output["path"] == output["url"] and output["url"].startswith(str(http.base_url).rstrip("/"))
    r = http.get(output["url"])
    assert r.status_code == 200 and r.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(r.content))
    assert (image.format, image.size) == ("PNG", size) == ("PNG", (output["width"], output["height"]))


def assert_error(r: httpx.Response, status: int, code: str, field: str) -> str:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert (error["code"], error["field"]) == (code, field), error
    return str(error["message"])


# ---- sync --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["service_schema_request.json", "http_server_sync.json", "text2image_request.yaml"]
)
def test_sync_generate_answers_outputs_whose_url_gets_the_png(http: httpx.Client, name: str) -> None:
    request = fixture(name)
    r = http.post("/v1/generate", json=request)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"outputs", "metadata"}
    [output] = body["outputs"]
    assert_png_at(http, output, (64, 64))
    meta = body["metadata"]
    assert (meta["model"], meta["task"], meta["backend"]) == (request["model"], "text2image", "cpu")
    assert meta["schema_version"] == "1.0.0" and meta["job_id"] == meta["run_id"]
    assert len(meta["trace_id"]) == 32 and meta["worker_id"] == "w-main"
    assert all(isinstance(v, float) for v in meta["timings"].values()) and meta["timings"]
    if name == "http_server_sync.json":  # the "fast" preset of the stand-in: one step
        assert meta["config_resolved"]["num_inference_steps"] == 1


def test_backend_cpu_stub_runs_and_one_no_worker_has_is_refused(http: httpx.Client) -> None:
    request = {**fixture("service_schema_request.json"), "backend": "cpu-stub"}
    r = http.post("/v1/generate", json=request)
    assert r.status_code == 200, r.text
    assert r.json()["metadata"]["backend"] == "cpu"
    before = http.get("/v1/jobs").json()["jobs"]
    for backend in ("cuda", "ascend"):
        r = http.post("/v1/generate", json={**request, "backend": backend})
        message = assert_error(r, 400, "FAILED_PRECONDITION", "backend")
        assert repr(backend) in message and "cpu" in message
    r = http.post("/v1/generate", json={**request, "backend": "tpu"})
    assert_error(r, 400, "INVALID_ARGUMENT", "backend")
    assert http.get("/v1/jobs").json()["jobs"] == before  # refused: no job made


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"config": {"model_path": "/models/sdxl"}}, "config.model_path"),
        ({"config": {"bogus_knob": 1}}, "config.bogus_knob"),
        ({"config": {"width": "wide"}}, "config.width"),
        ({"config": {"guidance_scale": 1e300}}, "config.guidance_scale"),
        ({"config": {"width": 60, "height": 64}}, "config.width"),  # the controller's check
        ({"config": {"max_sequence_length": 77}}, "config.max_sequence_length"),  # the worker's
        ({"inputs": {"prompt": "x", "image": "data:image/png;base64,AAAA"}}, "inputs.image"),
        ({"inputs": {"prompt": "x", "image": "inputs/portrait.png"}}, "inputs.image"),
        ({"inputs": {"prompt": 7}}, "inputs.prompt"),
        ({"task": "audio2text"}, "task"),
        ({"async_run": "yes"}, "async_run"),
        ({"adapters": [{"kind": "lora", "path": "style", "scale": "big"}]}, "adapters[0].scale"),
    ],
)
def test_a_fault_is_refused_naming_the_original_field(
    http: httpx.Client, change: dict[str, Any], field: str
) -> None:
    r = http.post("/v1/generate", json={**fixture("service_schema_request.json"), **change})
    assert_error(r, 400, "INVALID_ARGUMENT", field)


def test_our_own_shape_is_unchanged(http: httpx.Client) -> None:
    r = http.post("/v1/generate", json={"model": "sdxl-base-1.0", "prompt": "a lighthouse", "seed": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"]["state"] == "JOB_STATE_SUCCEEDED" and body["result"]["artifacts"][0]["data"]
    job_id = body["job"]["id"]
    job = http.get(f"/v1/jobs/{job_id}").json()["job"]
    assert job["state"] == "JOB_STATE_SUCCEEDED" and job["labels"] == {}
    # ...and the original's shape for it, when asked
    assert http.get(f"/v1/jobs/{job_id}?shape=original").json()["result"]["metadata"]["job_id"] == job_id
    assert_error(http.get(f"/v1/jobs/{job_id}?shape=v2"), 400, "INVALID_ARGUMENT", "shape")


def test_the_openapi_document_describes_both_bodies(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    generate = document["paths"]["/v1/generate"]["post"]
    body = {**generate["requestBody"]["content"]["application/json"]["schema"], **document}
    validator = Draft202012Validator(body)
    for name in ("service_schema_request.json", "http_server_async.json", "text2image_request.yaml"):
        validator.validate(fixture(name))  # exactly one of the two shapes (oneOf)
    validator.validate({"model": "sdxl-base-1.0", "prompt": "ours", "seed": "3"})
    assert not validator.is_valid({**fixture("http_server_sync.json"), "config": {"model_path": "/m"}})
    answer = http.post("/v1/generate", json=fixture("http_server_sync.json")).json()
    ok = generate["responses"]["200"]["content"]["application/json"]["schema"]
    Draft202012Validator({**ok, **document}).validate(answer)
    shape = {p["name"] for p in document["paths"]["/v1/jobs/{job_id}"]["get"]["parameters"]}
    assert {"shape", "X-Omnirt-Shape"} <= shape


# ---- async -------------------------------------------------------------------------------


def test_async_job_reads_back_in_the_original_shape(http: httpx.Client) -> None:
    request = fixture("service_schema_request.json") | {"async_run": True}
    r = http.post("/v1/generate", json=request)
    assert r.status_code == 200, r.text
    submitted = r.json()
    assert submitted["state"] in ("queued", "running") and len(submitted["trace_id"]) == 32
    assert submitted["request"]["model"] == "sdxl-base-1.0"
    job_id = submitted["id"]
    job = wait_final(http, job_id)
    assert job["state"] == "succeeded" and job["error"] is None
    result = job["result"]
    assert result["metadata"]["job_id"] == job_id and result["metadata"]["trace_id"] == submitted["trace_id"]
    assert_png_at(http, result["outputs"][0], (64, 64))
    # our shape, asked for: by query or by header
    ours = http.get(f"/v1/jobs/{job_id}", params={"shape": "omnirt"}).json()["job"]
    assert ours["state"] == "JOB_STATE_SUCCEEDED" and ours["labels"] == {"omnirt.shape": "original"}
    assert "job" in http.get(f"/v1/jobs/{job_id}", headers={"X-Omnirt-Shape": "omnirt"}).json()

    events = sse(http, f"/v1/jobs/{job_id}/events")
    names = [name for name, _ in events]
    assert names[0] == "job_enqueued" and names[-1] == "job_finished", names
    assert {"job_started", "stage_start", "stage_end", "stage_progress"} <= set(names)
    assert all(set(data) == {"event", "stage", "timestamp_ms", "data"} for _, data in events)
    assert all(data["event"] == name and data["data"]["job_id"] == job_id for name, data in events)
    assert [n for n, _ in sse(http, f"/v1/jobs/{job_id}/events?shape=omnirt")][-1] == "state_change"

    frames, code = asyncio.run(websocket(str(http.base_url), job_id, []))
    assert [f["event"] for f in frames] == names and code == 1000

    trace = http.get(f"/v1/jobs/{job_id}/trace").json()
    assert (trace["job_id"], trace["state"]) == (job_id, "succeeded")
    assert trace["trace_id"] == submitted["trace_id"]
    assert [e["event"] for e in trace["events"]] == names
    assert trace["spans"][0]["name"] == "queue" and len(trace["spans"]) > 1


def test_cancel_over_the_websocket_with_the_original_action(http: httpx.Client) -> None:
    # unserved-sd: no worker runs its mode, so the job waits until cancelled
    request = {"task": "text2image", "model": "unserved-sd", "inputs": {"prompt": "x"}, "async_run": True}
    job_id = http.post("/v1/generate", json=request).json()["id"]
    trace = http.get(f"/v1/jobs/{job_id}/trace").json()  # a live job's: its events so far
    assert trace["state"] == "queued" and [e["event"] for e in trace["events"]] == ["job_enqueued"]
    frames, code = asyncio.run(websocket(str(http.base_url), job_id, [{"action": "cancel"}]))
    acks = [f for f in frames if f["event"] == "control_ack"]
    assert acks and acks[0]["data"] == {"job_id": job_id, "cancelled": True}
    assert frames[-1]["event"] == "job_cancelled" and code == 1000
    assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"


def test_the_documented_async_video_request_runs(http: httpx.Client) -> None:
    r = http.post("/v1/generate", json=fixture("http_server_async.json"))
    assert r.status_code == 200, r.text
    job = wait_final(http, r.json()["id"])
    assert job["state"] == "succeeded", job
    [output] = job["result"]["outputs"]
    assert (output["kind"], output["mime"], output["num_frames"]) == ("video", "video/mp4", 5), output
    assert http.get(output["url"]).content[4:8] == b"ftyp"  # an MP4


def sse(http: httpx.Client, path: str) -> list[tuple[str, dict[str, Any]]]:
    """A finished job's SSE events: (event name, data)."""
    r = http.get(path)
    assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream", r.text
    events = []
    for block in r.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


async def websocket(
    base: str, job_id: str, send: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], int | None]:
    """The frames of a job's WebSocket until the server closes it, after sending `send`."""
    frames: list[dict[str, Any]] = []
    url = f"{base.rstrip('/')}/v1/jobs/{job_id}/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        for message in send:
            await ws.send_json(message)
        async for frame in ws:
            frames.append(json.loads(frame.data))
        return frames, ws.close_code


# ---- Redis: the shape is the job's, wherever it is read ------------------------------------


def test_a_redis_job_reads_back_in_its_shape_from_another_controller(
    log_dir: Path, catalog: Path, model_dir: Path
) -> None:
    redis = RedisServer(log_dir).start()
    store = ("--catalog", str(catalog), "--store", redis.url)
    first = Controller(log_dir, *store, http=True).start()
    second = Controller(log_dir, *store, http=True).start()
    worker = Worker(log_dir, first.address, "w-redis", model_dir, "--slots", "1").start()
    try:
        first.wait_worker("w-redis")
        with httpx.Client(base_url=first.http, timeout=60) as one, httpx.Client(base_url=second.http) as two:
            sync = one.post("/v1/generate", json=fixture("http_server_sync.json"))
            assert sync.status_code == 200 and sync.json()["metadata"]["backend"] == "cpu", sync.text
            request = fixture("service_schema_request.json") | {"backend": "cpu-stub", "async_run": True}
            job_id = one.post("/v1/generate", json=request).json()["id"]
            assert wait_final(one, job_id)["state"] == "succeeded"
            job = two.get(f"/v1/jobs/{job_id}").json()  # another controller, from the store
            assert job["state"] == "succeeded" and job["result"]["metadata"]["job_id"] == job_id
            assert_png_at(two, job["result"]["outputs"][0], (64, 64))
            r = two.post("/v1/generate", json={**request, "backend": "cuda"})
            assert_error(r, 400, "FAILED_PRECONDITION", "backend")  # the other's workers count
    finally:
        worker.stop()
        second.stop()
        first.stop()
        redis.stop()
