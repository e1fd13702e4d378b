"""Live previews through a real controller and worker: PREVIEW events over WatchJob (gRPC), SSE
and the WebSocket, per model (catalog `runtime.preview`) and per request (`extra.runtime.preview`);
a bad interval is INVALID_ARGUMENT naming the field."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from PIL import Image

import omnirt
from omnirt import errors
from tests.daemons import Controller, Worker

CATALOG = """
[[models]]
id = "tiny-sd-previews"
family = "sd"
tasks = ["text2image"]
execution_mode = "legacy_call"
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 6
[models.runtime]
preview = 2
"""


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "previews.toml"
    catalog.write_text(CATALOG)
    daemon = Controller(log_dir, "--catalog", str(catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir, controller.address, "w-previews", model_dir, "--models", "tiny-sd,tiny-sd-previews"
    ).start()
    controller.wait_worker("w-previews")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=120) as c:
        yield c


def job_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "tiny-sd",
        "prompt": "a fox",
        "width": 96,
        "height": 64,
        "num_inference_steps": 6,
        "seed": 3,
        **extra,
    }


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_watch_job_carries_previews_of_a_model_that_sets_them(client: omnirt.Client) -> None:
    job = client.submit(model="tiny-sd-previews", prompt="a fox", seed=1)
    events = list(client.watch(job.id, timeout=120))
    previews = [e for e in events if e.kind is omnirt.EventKind.PREVIEW]
    assert [e.progress.step for e in previews if e.progress] == [2, 4]
    assert {e.preview_mime_type for e in previews} == {"image/jpeg"}
    assert decoded(previews[0].preview).size == (64, 64)
    assert events[-1].state is omnirt.JobState.SUCCEEDED
    # The same model with previews turned off by the request: none.
    quiet = client.submit(
        model="tiny-sd-previews", prompt="a fox", seed=1, extra={"runtime": {"preview": False}}
    )
    assert not [e for e in client.watch(quiet.id, timeout=120) if e.kind is omnirt.EventKind.PREVIEW]


def test_sse_carries_previews_as_base64(http: httpx.Client) -> None:
    body = job_body(extra={"runtime": {"preview": {"every_steps": 3, "format": "webp"}}})
    job = http.post("/v1/jobs", json=body).json()["job"]
    with http.stream("GET", f"/v1/jobs/{job['id']}/events") as r:
        assert r.status_code == 200
        frames: list[dict[str, str]] = []
        current: dict[str, str] = {}
        for line in r.iter_lines():
            if not line:
                if current:
                    frames.append(current)
                current = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                current[key] = value
    previews = [json.loads(f["data"])["preview"] for f in frames if f.get("event") == "preview"]
    assert [p["step"] for p in previews] == [3]
    assert previews[0]["mime_type"] == "image/webp"
    image = decoded(base64.b64decode(previews[0]["data"]))
    assert image.format == "WEBP" and image.size == (96, 64)


def test_websocket_carries_previews(http: httpx.Client) -> None:
    job = http.post("/v1/jobs", json=job_body(extra={"runtime": {"preview": 1}})).json()["job"]
    url = str(http.base_url).replace("http", "ws", 1).rstrip("/")

    async def events() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{url}/v1/jobs/{job['id']}/stream") as ws,
        ):
            async for frame in ws:
                message = json.loads(frame.data)
                if "event" in message:
                    got.append(message["event"])
        return got

    previews = [e["preview"] for e in asyncio.run(events()) if "preview" in e]
    assert [p["step"] for p in previews] == [1, 2, 3, 4, 5]
    assert decoded(base64.b64decode(previews[-1]["data"])).format == "JPEG"


@pytest.mark.parametrize(
    ("preview", "field"),
    [
        (0, "extra.runtime.preview"),
        (1001, "extra.runtime.preview"),
        ({"every_steps": 5000}, "extra.runtime.preview.every_steps"),
        ({"format": "png"}, "extra.runtime.preview.format"),
    ],
)
def test_a_bad_preview_setting_is_invalid_argument_naming_the_field(
    client: omnirt.Client, http: httpx.Client, preview: Any, field: str
) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        client.submit(model="tiny-sd", prompt="x", extra={"runtime": {"preview": preview}})
    assert caught.value.field == field, caught.value
    assert field in str(caught.value)
    r = http.post("/v1/jobs", json=job_body(extra={"runtime": {"preview": preview}}))
    assert r.status_code == 400 and r.json()["error"]["field"] == field, r.text
