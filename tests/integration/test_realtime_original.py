"""The original OmniRT's realtime clients, unchanged, against `WS /v1/avatar/realtime`: a plain
WebSocket client (aiohttp's) replays the original's own test of that route
(`tests/fixtures/original_realtime_avatar.json`) on a real controller and a real worker running
the tiny talking head, and gets the original's answers in the original's order.

Each chunk is 17,920 samples in, 28 JPEG frames of 64x64 out (about 0.2-0.5 s of this CPU).
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.daemons import Controller, Worker
from tests.integration.test_realtime_sessions import portrait, speech

FIXTURE = Path(__file__).parent.parent / "fixtures" / "original_realtime_avatar.json"
MODEL, CHUNK = "tiny-talking-head", 17920
TIMEOUT = 60


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def th_worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir, controller.address, "w-orig", model_dir, "--models", MODEL, "--session-slots", "2"
    ).start()
    controller.wait_worker("w-orig")
    yield daemon
    daemon.stop()


def run(controller: Controller, scenario: Callable[[Callable[[], Any]], Awaitable[None]]) -> None:
    """`scenario(connect)`, where `connect()` opens a WebSocket to the controller's route."""

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            await scenario(lambda: http.ws_connect(f"{controller.http}/v1/avatar/realtime"))

    asyncio.run(go())


async def answer(ws: aiohttp.ClientWebSocketResponse) -> tuple[str, Any]:
    """The next answer's type ("VIDX" for video) and the answer (a dict, or the JPEG frames)."""
    message = await ws.receive(timeout=TIMEOUT)
    if message.type is aiohttp.WSMsgType.BINARY:
        data: bytes = message.data
        assert data[:4] == b"VIDX", data[:16]
        frames, offset = [], 8
        for _ in range(struct.unpack("<I", data[4:8])[0]):
            (size,) = struct.unpack("<I", data[offset : offset + 4])
            frames.append(data[offset + 4 : offset + 4 + size])
            offset += 4 + size
        return "VIDX", frames
    assert message.type is aiohttp.WSMsgType.TEXT, (message.type, message.data, message.extra)
    body = json.loads(message.data)
    return body["type"], body


def create(**config: Any) -> dict[str, Any]:
    image = base64.b64encode(portrait()).decode()
    return {"type": "session.create", "model": MODEL, "inputs": {"image_b64": image}, "config": config}


async def closes_cleanly(ws: aiohttp.ClientWebSocketResponse) -> None:
    last = await ws.receive(timeout=TIMEOUT)
    assert last.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1000, (last.type, ws.close_code)


def test_the_original_clients_test_gets_the_original_answers_in_order(
    controller: Controller, th_worker: Worker
) -> None:
    steps = json.loads(FIXTURE.read_text())["steps"]
    image = base64.b64encode(portrait()).decode()

    async def scenario(connect: Callable[[], Any]) -> None:
        got: list[tuple[str, Any]] = []
        async with connect() as ws:
            for step in steps:
                if "audio" in step:
                    await ws.send_bytes(b"AUDI" + bytes(2 * step["audio"]))
                else:
                    await ws.send_str(json.dumps(step["send"]).replace("<portrait>", image))
                for expected in step["expect"]:
                    got.append(await answer(ws))
                    assert got[-1][0] == expected, (expected, got[-1])
            await closes_cleanly(ws)
        (_, created), (_, metrics), (_, frames), (_, cancelled), (_, closed) = got
        assert created["audio"]["chunk_samples"] == CHUNK and created["video"]["width"] == 64
        assert metrics["chunk_index"] == 1 and len(frames) == 28
        assert cancelled == {"type": "session.cancelled", "session_id": created["session_id"]}
        assert closed["session_id"] == created["session_id"] and closed["reason"] == "ended"

    run(controller, scenario)


def test_after_session_cancel_the_session_still_animates_what_comes_next(
    controller: Controller, th_worker: Worker
) -> None:
    async def scenario(connect: Callable[[], Any]) -> None:
        async with connect() as ws:
            await ws.send_json({**create(seed=3), "progress": True})
            assert (await answer(ws))[0] == "session.created"
            await ws.send_bytes(b"AUDI" + speech(0))
            # OmniRT's own session.progress: only to a client that asked for it.
            assert [(await answer(ws))[0] for _ in range(3)] == ["metrics", "VIDX", "session.progress"]
            await ws.send_json({"type": "session.cancel"})
            assert (await answer(ws))[0] == "session.cancelled"
            await ws.send_bytes(b"AUDI" + speech(1))
            kind, metrics = await answer(ws)
            assert (kind, metrics["chunk_index"]) == ("metrics", 2)
            kind, frames = await answer(ws)
            assert kind == "VIDX" and len(frames) == 28
            await ws.send_json({"type": "session.close"})
            while (got := await answer(ws))[0] == "session.progress":
                pass
            assert got[0] == "session.closed" and int(got[1]["report"]["chunks_out"]) == 2, got
            await closes_cleanly(ws)

    run(controller, scenario)


def test_config_chunk_samples_must_be_the_models_and_a_refusal_costs_no_one_else(
    controller: Controller, th_worker: Worker
) -> None:
    async def refused(connect: Callable[[], Any], chunk_samples: Any) -> dict[str, Any]:
        async with connect() as ws:
            await ws.send_json(create(chunk_samples=chunk_samples))
            kind, error = await answer(ws)
            assert kind == "error", error
            closing = await ws.receive(timeout=TIMEOUT)
            assert closing.type is aiohttp.WSMsgType.CLOSE and ws.close_code == 1008
            return error

    async def opened(connect: Callable[[], Any]) -> Any:
        """A session with the model's chunk_samples, once a slot is free (a refused session's
        slot frees when its worker stream ends: moments later)."""
        for _ in range(40):
            ws = await connect()
            await ws.send_json(create(chunk_samples=CHUNK))
            kind, body = await answer(ws)
            if kind == "session.created":
                return ws
            assert body.get("code") == "RESOURCE_EXHAUSTED", body
            await ws.close()
            await asyncio.sleep(0.25)
        raise AssertionError("no slot freed")

    async def scenario(connect: Callable[[], Any]) -> None:
        held = await opened(connect)
        error = await refused(connect, 16)
        assert (error["code"], error["field"]) == ("INVALID_ARGUMENT", "config.chunk_samples"), error
        assert "16" in error["message"] and str(CHUNK) in error["message"], error
        error = await refused(connect, "many")
        assert (error["code"], error["field"]) == ("INVALID_ARGUMENT", "config.chunk_samples"), error
        # The session already open goes on, and the refused one's slot is free again.
        await held.send_bytes(b"AUDI" + speech(0))
        assert [(await answer(held))[0] for _ in range(2)] == ["metrics", "VIDX"]
        other = await opened(connect)
        for ws in (held, other):
            await ws.send_json({"type": "session.close"})
            assert (await answer(ws))[0] == "session.closed"
            await closes_cleanly(ws)

    run(controller, scenario)
