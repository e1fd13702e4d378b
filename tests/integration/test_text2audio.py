"""text2audio through a real controller and worker: a user catalog names the tiny Stable Audio.

The artifact's sample rate, channels and duration travel worker -> controller -> client, over
gRPC (the SDK) and over the HTTP gateway's native generate route, and the model's
max_duration_ms is enforced by the controller before a job is queued.
"""

from __future__ import annotations

import base64
import hashlib
import io
import wave
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import omnirt
from omnirt import errors
from omnirt.types import MediaKind, Task
from tests.daemons import Controller, Worker

AUDIO_CATALOG = """
[[models]]
id = "my-audio"
family = "stable-audio"
tasks = ["text2audio"]
execution_mode = "legacy_call"
source = "builtin:tiny-stable-audio"
pipeline_class = "StableAudioPipeline"
[models.defaults]
num_inference_steps = 4
guidance_scale = 3.0
[models.limits]
max_duration_ms = 2048
max_num_outputs = 2
"""


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "audio.toml"
    catalog.write_text(AUDIO_CATALOG)
    daemon = Controller(log_dir, "--catalog", str(catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


def wav_facts(data: bytes) -> tuple[int, int, int]:
    """(sample rate, channels, samples) of a WAV."""
    with wave.open(io.BytesIO(data)) as reader:
        return reader.getframerate(), reader.getnchannels(), reader.getnframes()


def test_text2audio_with_the_sdk_carries_rate_channels_and_duration(client: omnirt.Client) -> None:
    result = client.generate(
        model="my-audio", prompt="rain on a tin roof", duration_ms=1250, seed=5, timeout=120
    )
    [clip] = result.artifacts
    assert (clip.kind, clip.mime_type) == (MediaKind.AUDIO, "audio/wav")
    assert (clip.sample_rate, clip.channels, clip.duration_ms) == (8000, 2, 1250)
    assert clip.verify()
    assert wav_facts(clip.data) == (8000, 2, 10_000)
    assert result.report.task is Task.TEXT2AUDIO
    assert result.report.pipeline_class == "StableAudioPipeline"
    again = client.generate(
        model="my-audio", prompt="rain on a tin roof", duration_ms=1250, seed=5, timeout=120
    )
    assert again.artifacts[0].sha256 == clip.sha256


def test_mp3_by_output_format(client: omnirt.Client) -> None:
    result = client.generate(
        model="my-audio", prompt="a bird", duration_ms=1000, output_format="mp3", num_outputs=2, timeout=120
    )
    assert [(a.mime_type, a.sample_rate, a.channels, a.duration_ms) for a in result.artifacts] == [
        ("audio/mpeg", 8000, 2, 1000)
    ] * 2
    assert result.artifacts[0].data[:3] == b"ID3"


def test_a_duration_past_the_models_limit_is_refused_before_queueing(client: omnirt.Client) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(model="my-audio", prompt="a bird", duration_ms=5000, timeout=60)
    assert info.value.field == "duration_ms"
    assert "at most 2048" in str(info.value)


def test_the_http_generate_route_returns_audio(controller: Controller, worker: Worker) -> None:
    body = {
        "model": "my-audio",
        "task": "TASK_TEXT2AUDIO",
        "prompt": "wind in the trees",
        "duration_ms": 500,
        "output": {"format": "flac"},
    }
    with httpx.Client(base_url=controller.http, timeout=120) as http:
        response = http.post("/v1/generate", json=body)
        assert response.status_code == 200, response.text
        [clip] = response.json()["result"]["artifacts"]
        assert (clip["kind"], clip["mime_type"]) == ("MEDIA_KIND_AUDIO", "audio/flac")
        assert (clip["sample_rate"], clip["channels"], int(clip["duration_ms"])) == (8000, 2, 500)
        assert base64.b64decode(clip["data"])[:4] == b"fLaC"
        # Over the inline limit it goes by URL; the download has the audio's MIME type.
        body["output"] = {"format": "mp3", "inline_limit_bytes": 1}
        response = http.post("/v1/generate", json=body)
        [clip] = response.json()["result"]["artifacts"]
        assert clip["data"] == "" and clip["sample_rate"] == 8000
        download = http.get(clip["uri"])
        assert download.status_code == 200 and download.headers["content-type"] == "audio/mpeg"
        assert hashlib.sha256(download.content).hexdigest() == clip["sha256"]
