"""Sessions driven by text end to end: a client (the SDK), a real controller and a real worker
serving `tiny-vits-stream` (text in, 0.5 s audio chunks out) and `tiny-talking-head-tts` (a
talking head whose text is spoken by tiny-vits), in-process (`legacy_call`, 2 session slots).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from omnirt.errors import OmniRTError
from tests.daemons import Controller, Worker

SPEECH_CHUNK, HEAD_CHUNK, FRAMES = 8000, 17920, 28


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog)).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-speech",
        model_dir,
        "--models",
        "tiny-vits-stream,tiny-talking-head-tts",
        "--session-slots",
        "2",
    ).start()
    controller.wait_worker("w-speech")
    yield daemon
    daemon.stop()


def portrait() -> bytes:
    rng = np.random.default_rng(3)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def test_text_is_spoken_back_in_audio_chunks_and_a_bad_voice_names_its_field(
    controller: Controller, worker: Worker
) -> None:
    with controller.client() as client:
        with client.open_session("tiny-vits-stream", config={"seed": 4}) as session:
            ready = session.ready
            assert (ready.chunk_samples, ready.sample_rate) == (SPEECH_CHUNK, 16000)
            assert ready.frames_per_chunk == 0
            session.send_text("Hello there. This is a realtime session speaking.")
            session.end()
            out = list(session)
            closed = session.closed
        assert closed is not None and closed.reason == "ended"
        assert len(out) >= 2 and [c.sequence for c in out] == list(range(1, len(out) + 1))
        assert all(len(c.audio) == 2 * SPEECH_CHUNK and not c.frames for c in out)
        assert np.abs(np.frombuffer(b"".join(c.audio for c in out), "<i2")).max() > 1000

        with client.open_session("tiny-vits-stream") as session:
            session.send_text("Hello.", voice="alloy")
            session.end()
            with pytest.raises(OmniRTError) as refused:
                list(session)
        assert (refused.value.code.name, refused.value.field) == ("INVALID_ARGUMENT", "text.voice")


def test_a_talking_head_speaks_text_into_frames(controller: Controller, worker: Worker) -> None:
    with (
        controller.client() as client,
        client.open_session("tiny-talking-head-tts", image=portrait(), config={"seed": 7}) as session,
    ):
        assert (session.ready.chunk_samples, session.ready.frames_per_chunk) == (HEAD_CHUNK, FRAMES)
        session.send_text("Good morning. Nice to see you.")
        session.end()
        out = list(session)
        closed = session.closed
    assert closed is not None and closed.reason == "ended"
    assert out and all(len(c.frames) == FRAMES and len(c.audio) == 2 * HEAD_CHUNK for c in out)
    assert np.abs(np.frombuffer(out[0].audio, "<i2")).max() > 1000, "the frames come with the speech"
