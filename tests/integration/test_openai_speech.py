"""`POST /v1/audio/speech` through real daemons, with the official `openai` client.

One controller with `--http` and one worker; a user catalog names the tiny Stable Audio (a
text2audio diffusers pipeline). The route answers the audio file itself (whole, streamed in
chunks, or as OpenAI's SSE events); its errors have OpenAI's shape and name the parameter.
"""

from __future__ import annotations

import base64
import io
import json
import wave
from collections.abc import Iterator
from pathlib import Path

import av
import httpx
import openai
import pytest

from tests.daemons import Controller, Worker

CATALOG = """
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
duration_ms = 500
[models.limits]
max_duration_ms = 2048
"""
SPOKEN = {"model": "my-audio", "voice": "alloy", "input": "rain on a tin roof", "extra_body": {"seed": 5}}


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "speech.toml"
    catalog.write_text(CATALOG)
    daemon = Controller(log_dir, "--catalog", str(catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def oai(controller: Controller, worker: Worker) -> openai.OpenAI:
    return openai.OpenAI(base_url=controller.http + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=120) as client:
        yield client


def wav_facts(data: bytes) -> tuple[int, int, int]:
    """(sample rate, channels, samples) of a WAV."""
    with wave.open(io.BytesIO(data)) as reader:
        return reader.getframerate(), reader.getnchannels(), reader.getnframes()


def test_the_openai_client_gets_a_wav_and_the_same_seed_gives_the_same_bytes(oai: openai.OpenAI) -> None:
    speech = oai.audio.speech.create(**SPOKEN, response_format="wav")  # type: ignore[arg-type]
    assert speech.response.headers["content-type"] == "audio/wav"
    assert wav_facts(speech.content) == (8000, 2, 4000)  # the catalog's 500 ms at 8 kHz, stereo
    assert speech.response.headers["x-omnirt-sample-rate"] == "8000"
    again = oai.audio.speech.create(**SPOKEN, response_format="wav")  # type: ignore[arg-type]
    assert again.content == speech.content
    other = oai.audio.speech.create(**{**SPOKEN, "extra_body": {"seed": 6}}, response_format="wav")  # type: ignore[arg-type]
    assert other.content != speech.content


def test_mp3_is_the_default_and_the_streaming_response_reads_it_in_chunks(
    oai: openai.OpenAI, http: httpx.Client
) -> None:
    with oai.audio.speech.with_streaming_response.create(**SPOKEN) as response:  # type: ignore[arg-type]
        assert response.headers["content-type"] == "audio/mpeg"
        chunks = list(response.iter_bytes(1024))
    mp3 = b"".join(chunks)
    assert len(chunks) > 1
    with av.open(io.BytesIO(mp3)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name.startswith("mp3") and stream.rate == 8000
    job_id = response.headers["x-omnirt-job-id"]
    job = http.get(f"/v1/jobs/{job_id}").json()["job"]
    assert job["task"] == "TASK_TEXT2AUDIO"


def test_sse_stream_format_sends_the_audio_as_delta_events_then_done(http: httpx.Client) -> None:
    body = {"model": "my-audio", "voice": "alloy", "input": "rain", "seed": 5, "response_format": "wav"}
    r = http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[len("data: ") :]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    whole = http.post("/v1/audio/speech", json=body)
    assert audio == whole.content and wav_facts(audio)[0] == 8000
    assert events[-1]["usage"]["input_tokens"] == len("rain")


def test_bad_parameters_are_openai_errors_naming_them(oai: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        oai.audio.speech.create(**{**SPOKEN, "input": "x" * 4097})  # type: ignore[arg-type]
    assert bad.value.param == "input"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.audio.speech.create(**SPOKEN, speed=0.1)  # type: ignore[arg-type]
    assert bad.value.param == "speed"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.audio.speech.create(**SPOKEN, instructions="whisper")  # type: ignore[arg-type]
    assert bad.value.param == "instructions"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.audio.speech.create(**SPOKEN, response_format="opus-ish")  # type: ignore[arg-type]
    assert bad.value.param == "output.format"
    with pytest.raises(openai.NotFoundError) as missing:
        oai.audio.speech.create(**{**SPOKEN, "model": "tts-1"})  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    r = http.post("/v1/audio/speech", json={"model": "my-audio", "input": "rain"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"
    r = http.post("/v1/audio/speech", json={"model": "my-audio", "voice": "alloy"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    # Stable Audio has no speaking rate: the worker refuses the extra, naming it.
    with pytest.raises(openai.BadRequestError) as bad:
        oai.audio.speech.create(**SPOKEN, speed=2.0)  # type: ignore[arg-type]
    assert bad.value.param == "extra.speed"
    # ... and the daemons serve on.
    assert oai.audio.speech.create(**SPOKEN, response_format="wav").content  # type: ignore[arg-type]


def test_a_speech_model_speaks_the_input_and_speed_shortens_it(oai: openai.OpenAI) -> None:
    spoken = {
        "model": "tiny-vits",
        "voice": "alloy",
        "input": "hello there my dog is cute",
        "extra_body": {"seed": 3},
    }
    normal = oai.audio.speech.create(**spoken, response_format="wav")  # type: ignore[arg-type]
    rate, channels, samples = wav_facts(normal.content)
    assert (rate, channels) == (16000, 1) and samples > 0
    fast = oai.audio.speech.create(**spoken, response_format="wav", speed=2.0)  # type: ignore[arg-type]
    assert wav_facts(fast.content)[2] < samples * 0.8
    longer = oai.audio.speech.create(
        **{**spoken, "input": "hello there my dog is cute " * 3}, response_format="wav"
    )  # type: ignore[arg-type]
    assert wav_facts(longer.content)[2] > samples
    pcm = oai.audio.speech.create(**spoken, response_format="pcm")  # type: ignore[arg-type]
    assert pcm.response.headers["content-type"] == "audio/pcm"
    with wave.open(io.BytesIO(normal.content)) as reader:
        assert pcm.content == reader.readframes(samples)  # raw s16le: the WAV's very samples
