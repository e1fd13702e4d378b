"""Realtime sessions end to end: a client, a real controller and real workers running the tiny
talking head, in-process (`legacy_call`, 2 session slots) and on a resident 2-rank torchrun
group (`persistent_worker`, gloo on CPU).

Each chunk is 1.12 s of 16 kHz audio (17,920 samples) in, 28 JPEG frames of 64x64 out; a
chunk costs this machine's CPU about 0.2-0.5 s.
"""

from __future__ import annotations

import io
import os
import signal
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from PIL import Image

from omnirt.errors import OmniRTError
from tests.daemons import Controller, Worker, wait_for
from tests.integration.test_persistent_worker import rank_pid

CHUNK = 17920
T = TypeVar("T")


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), http=True).start()
    yield daemon
    daemon.stop()


def portrait() -> bytes:
    rng = np.random.default_rng(3)
    image = Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def speech(index: int, samples: int = CHUNK) -> bytes:
    """A tone of its own per chunk, as pcm_s16le."""
    t = np.arange(samples) / 16000.0
    wave = 0.3 * np.sin(2 * np.pi * (180 + 40 * index) * t)
    return (wave * 32767).astype("<i2").tobytes()


def until(check: Callable[[], T | None], timeout: float, what: str) -> T:
    """`check()`'s first value that is not None (polled)."""
    found: list[T] = []

    def done() -> bool:
        value = check()
        if value is not None:
            found.append(value)
        return value is not None

    wait_for(done, timeout, what)
    return found[0]


def frames_of(chunk: object) -> list[np.ndarray]:
    return [np.asarray(Image.open(io.BytesIO(f))) for f in chunk.frames]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def th_worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-th",
        model_dir,
        "--models",
        "tiny-talking-head",
        "--session-slots",
        "2",
    ).start()
    controller.wait_worker("w-th")
    yield daemon
    daemon.stop()


def test_a_session_streams_every_chunk_in_order_with_its_audio(
    controller: Controller, th_worker: Worker
) -> None:
    with (
        controller.client() as client,
        client.open_session("tiny-talking-head", image=portrait(), config={"seed": 7}) as session,
    ):
        ready = session.ready
        assert (ready.chunk_samples, ready.sample_rate, ready.fps, ready.frames_per_chunk) == (
            CHUNK,
            16000,
            25,
            28,
        )
        for index in range(3):
            session.send_audio(speech(index))
        session.end()
        chunks = list(session)
        closed = session.closed
    assert [c.sequence for c in chunks] == [1, 2, 3]
    assert [c.pts_ms for c in chunks] == [0.0, 1120.0, 2240.0]
    assert [c.audio for c in chunks] == [speech(i) for i in range(3)], "each chunk with its own audio"
    for chunk in chunks:
        frames = frames_of(chunk)
        assert len(frames) == 28 and all(f.shape == (64, 64, 3) for f in frames)
    assert closed is not None and closed.reason == "ended"
    report = closed.report
    assert (report.chunks_in, report.chunks_out, report.worker_id) == (3, 3, "w-th")
    assert report.first_chunk_latency_ms > 0 and report.real_time_factor > 0


def test_two_sessions_at_once_on_a_two_slot_worker_and_a_third_is_refused(
    controller: Controller, th_worker: Worker
) -> None:
    results: dict[int, list[int]] = {}
    with controller.client() as client:
        sessions = [client.open_session("tiny-talking-head", image=portrait()) for _ in range(2)]
        with pytest.raises(OmniRTError) as full:
            client.open_session("tiny-talking-head", image=portrait())
        assert full.value.code.name == "RESOURCE_EXHAUSTED"

        def feed(index: int) -> None:
            session = sessions[index]
            session.send_audio(speech(index))
            session.send_audio(speech(index + 1))
            session.end()
            results[index] = [c.sequence for c in session]

        threads = [threading.Thread(target=feed, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert results == {0: [1, 2], 1: [1, 2]}


def test_a_client_that_goes_away_frees_its_slot_at_once(controller: Controller, th_worker: Worker) -> None:
    with controller.client() as client:
        held = [client.open_session("tiny-talking-head", image=portrait()) for _ in range(2)]
        held[0].send_audio(speech(0))
        held[0].close()  # gone mid-chunk
        # The slot frees when the worker's stream for it ends: moments later.
        session = until(lambda: _try_open(client), 20, "the freed slot")
        session.end()
        assert list(session) == [] and session.closed.reason == "ended"
        held[1].close()


def _try_open(client: Any) -> Any:
    try:
        return client.open_session("tiny-talking-head", image=portrait())
    except OmniRTError as exc:
        assert exc.code.name == "RESOURCE_EXHAUSTED"
        return None


def test_a_reference_that_does_not_decode_is_invalid_argument_and_the_worker_serves_on(
    controller: Controller, th_worker: Worker
) -> None:
    with controller.client() as client:
        with pytest.raises(OmniRTError) as bad:
            client.open_session("tiny-talking-head", image=b"not an image")
        assert bad.value.code.name == "INVALID_ARGUMENT" and bad.value.field
        with client.open_session("tiny-talking-head", image=portrait()) as session:
            session.send_audio(speech(0))
            session.end()
            assert [c.sequence for c in session] == [1]


def test_the_websocket_protocol_with_a_plain_client(controller: Controller, th_worker: Worker) -> None:
    import asyncio
    import base64

    import aiohttp

    async def go() -> None:
        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"{controller.http}/v1/avatar/realtime") as ws,
        ):
            await ws.send_json(
                {
                    "type": "session.create",
                    "model": "tiny-talking-head",
                    "inputs": {"image_b64": base64.b64encode(portrait()).decode()},
                    "config": {"seed": 1},
                }
            )
            created = await ws.receive_json(timeout=60)
            assert created["type"] == "session.created", created
            await ws.send_bytes(b"AUDI" + speech(0))
            metrics = await ws.receive_json(timeout=60)
            assert metrics["type"] == "metrics" and metrics["chunk_index"] == 1
            video = await ws.receive_bytes(timeout=60)
            (count,) = struct.unpack("<I", video[4:8])
            assert video[:4] == b"VIDX" and count == 28
            (size,) = struct.unpack("<I", video[8:12])
            assert Image.open(io.BytesIO(video[12 : 12 + size])).size == (64, 64)
            await ws.send_json({"type": "session.close"})
            while (message := await ws.receive_json(timeout=60))["type"] != "session.closed":
                assert message["type"] == "session.progress"
            assert message["reason"] == "ended"

    asyncio.run(go())


# ---- persistent_worker: the same model on a resident 2-rank group ------------------------------


@pytest.fixture(scope="module")
def pw_th_worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-th-pw",
        model_dir,
        "--mode",
        "persistent_worker",
        "--models",
        "tiny-talking-head-pw",
    ).start()
    controller.wait_worker("w-th-pw")
    yield daemon
    daemon.stop()


def test_a_killed_rank_ends_the_session_unavailable_and_the_next_session_works(
    controller: Controller, pw_th_worker: Worker, model_dir: Path
) -> None:
    with controller.client() as client:
        session = client.open_session("tiny-talking-head-pw", image=portrait(), config={"seed": 7})
        session.send_audio(speech(0))
        chunks = iter(session)
        first = next(chunks)
        assert first.sequence == 1 and len(first.frames) == 28
        os.kill(rank_pid(model_dir, 1), signal.SIGKILL)
        session.send_audio(speech(1))
        with pytest.raises(OmniRTError) as lost:
            for _ in chunks:
                pass
        assert lost.value.code.name == "UNAVAILABLE", lost.value
        session.close()

        def reopened() -> Any:
            try:
                return client.open_session("tiny-talking-head-pw", image=portrait(), config={"seed": 7})
            except OmniRTError as exc:  # the group restarts (seconds)
                assert exc.code.name in ("UNAVAILABLE", "RESOURCE_EXHAUSTED"), exc
                return None

        again = until(reopened, 120, "a session after the restart")
        again.send_audio(speech(0))
        again.end()
        assert [c.sequence for c in again] == [1]
