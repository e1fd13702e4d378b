"""The subprocess mode through real daemons: a controller and `omnirt-worker --mode subprocess`."""

from __future__ import annotations

import io
import textwrap
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

import omnirt
from omnirt import errors
from omnirt.types import EventKind, JobState, MediaKind
from omnirt.worker.modes.subprocess.child_process import process_state
from tests.daemons import Controller, Worker

RATE = 16000
FPS = 10.0
SLEEPER = """
import json, os, subprocess, time
from pathlib import Path
request = json.loads(Path(os.environ["OMNIRT_REQUEST"]).read_text())
grandchild = subprocess.Popen(["sleep", "60"])
Path(request["extra"]["pid_file"]).write_text(f"{os.getpid()} {grandchild.pid}")
print("ready", flush=True)
time.sleep(60)
"""
CATALOG = """
[[models]]
id = "sleeper"
tasks = ["text2image"]
execution_mode = "subprocess"
[models.runtime]
command = "sleeper.py"
timeout_s = 120
kill_grace_s = 1
"""


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("scripts")
    (folder / "sleeper.py").write_text(textwrap.dedent(SLEEPER))
    return folder


@pytest.fixture(scope="module")
def controller(log_dir: Path, scripts: Path) -> Iterator[Controller]:
    catalog = scripts / "catalog.toml"
    catalog.write_text(CATALOG)
    daemon = Controller(log_dir, "--catalog", str(catalog)).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path, scripts: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-sub",
        model_dir,
        "--mode",
        "subprocess",
        "--slots",
        "2",
        "--script-dirs",
        str(scripts),
    ).start()
    controller.wait_worker("w-sub")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


def face_png() -> bytes:
    image = Image.new("RGB", (96, 96), (110, 140, 190))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def half_silent_wav(seconds: float = 2.0) -> bytes:
    """Silence for the first half, a loud 440 Hz tone for the second."""
    t = np.arange(int(RATE * seconds)) / RATE
    signal = np.where(t < seconds / 2, 0.0, 0.7 * np.sin(2 * np.pi * 440 * t))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes((signal * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def decode(data: bytes) -> tuple[list[np.ndarray], dict[str, float]]:
    with av.open(io.BytesIO(data)) as container:
        (audio,) = container.streams.audio
        facts = {"rate": float(audio.rate), "audio_s": float(audio.duration * audio.time_base)}
        frames = [f.to_ndarray(format="rgb24").astype(np.float32) for f in container.decode(video=0)]
    return frames, facts


def test_talking_head_returns_an_mp4_whose_frames_follow_the_loudness(client: omnirt.Client) -> None:
    result = client.generate(
        model="talking-head-demo",
        task="audio2video",
        image=face_png(),
        audio=half_silent_wav(),
        fps=FPS,
        width=64,
        height=64,
        timeout=120,
    )
    (video,) = result.artifacts
    assert (video.kind, video.mime_type) == (MediaKind.VIDEO, "video/mp4") and video.verify()
    assert (video.num_frames, video.fps, video.width, video.height) == (20, FPS, 64, 64)
    frames, facts = decode(video.data)
    assert len(frames) == 20 and frames[0].shape == (64, 64, 3)
    assert facts["rate"] == RATE and 1.9 <= facts["audio_s"] <= 2.2, "the audio track is muxed in"
    silent, loud = frames[:10], frames[10:]
    assert all(np.abs(f - silent[0]).mean() < 1 for f in silent[1:]), "silence: a still face"
    assert all(np.abs(f - silent[0]).mean() > 10 for f in loud), "loud audio: another picture"
    assert np.mean(loud[5]) > np.mean(silent[5]) + 10, "louder frames are brighter"
    report = result.report
    assert (report.execution_mode, report.worker_id, report.model) == (
        "subprocess",
        "w-sub",
        "talking-head-demo",
    )
    assert {"run", "analyze", "render", "export"} <= {t.name for t in report.timings}


def test_watch_shows_progress_per_frame_and_the_script_log(client: omnirt.Client) -> None:
    job = client.submit(
        model="talking-head-demo", task="audio2video", image=face_png(), audio=half_silent_wav(1.0), fps=FPS
    )
    events = list(client.watch(job.id, timeout=120))
    progress = [(e.progress.step, e.progress.total_steps) for e in events if e.kind is EventKind.PROGRESS]
    assert progress == [(i, 10) for i in range(1, 11)]
    logs = [e.log_text for e in events if e.kind is EventKind.LOG]
    assert any("10 frames of 128x128 at 10 fps" in line for line in logs), logs
    assert events[-1].state is JobState.SUCCEEDED


def test_audio_that_is_not_a_wav_is_invalid_argument_naming_the_input(
    client: omnirt.Client, worker: Worker
) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(
            model="talking-head-demo",
            task="audio2video",
            image=face_png(),
            audio=b"ID3\x03 mp3 bytes",
            timeout=60,
        )
    assert info.value.field == "inputs[1]" and "must be wav" in str(info.value)
    assert worker.alive()


def test_a_request_cannot_name_a_command(client: omnirt.Client) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(
            model="talking-head-demo",
            task="audio2video",
            image=face_png(),
            audio=half_silent_wav(0.5),
            extra={"command": "/bin/sh -c 'echo pwned'"},
            timeout=60,
        )
    assert info.value.field == "extra.command"


def test_cancel_of_a_running_job_kills_its_process_group(
    client: omnirt.Client, worker: Worker, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    job = client.submit(model="sleeper", prompt="sleep", extra={"pid_file": str(pid_file)})
    for event in client.watch(job.id, timeout=60):
        if event.kind is EventKind.LOG and event.log_text == "ready":
            break
    pids = [int(x) for x in pid_file.read_text().split()]
    assert all(process_state(pid) not in (None, "Z") for pid in pids), "both run before the cancel"
    assert client.cancel(job.id).cancelled
    with pytest.raises(errors.Cancelled):
        client.wait(job.id, timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(process_state(pid) not in (None, "Z") for pid in pids):
        time.sleep(0.05)
    assert all(process_state(pid) in (None, "Z") for pid in pids), "the script and its grandchild are gone"
    assert worker.alive()
    again = client.generate(
        model="talking-head-demo",
        task="audio2video",
        image=face_png(),
        audio=half_silent_wav(0.5),
        timeout=60,
    )
    assert again.artifacts[0].num_frames == 13, "the worker keeps serving (0.5 s at 25 fps)"
