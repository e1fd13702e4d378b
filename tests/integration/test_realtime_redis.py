"""Realtime sessions with several controllers on one Redis: a session lives on the controller
it was opened on (which relays it) and every controller lists it (ClusterService.ListSessions,
`omnirtctl sessions list`) until it ends. The worker is the scripted peer of
test_realtime_relay.py, speaking the worker protocol over real gRPC."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from omnirt.v1 import realtime_pb2_grpc
from tests.daemons import Controller, RedisServer
from tests.integration.test_realtime_relay import END, MODEL, ClientSession, ScriptedWorker, open_message


@pytest.fixture(scope="module")
def pair(log_dir: Path) -> Iterator[tuple[Controller, Controller]]:
    server = RedisServer(log_dir).start()
    first = Controller(log_dir, "--store", server.url).start()
    second = Controller(log_dir, "--store", server.url).start()
    yield first, second
    second.stop()
    first.stop()
    server.stop()


def listed(controller: Controller) -> list[Any]:
    with controller.client() as client:
        return client.list_sessions()


def test_a_session_on_one_controller_is_listed_by_the_other_until_it_ends(
    pair: tuple[Controller, Controller],
) -> None:
    first, second = pair

    async def scenario() -> None:
        async with (
            grpc.aio.insecure_channel(first.address) as channel,
            ScriptedWorker(first.address, "w-redis", slots=1),
        ):
            session = ClientSession(
                realtime_pb2_grpc.RealtimeServiceStub(channel), open_message(labels={"room": "7"})
            )
            ready = (await session.read()).ready
            for view in (second, first):
                sessions = await asyncio.to_thread(listed, view)
                assert [(s.session_id, s.model, s.worker_id, s.controller) for s in sessions] == [
                    (ready.session_id, MODEL, "w-redis", first.address)
                ], view.address
                assert sessions[0].labels == {"room": "7"} and sessions[0].opened_at is not None
            argv = [
                sys.executable,
                "-m",
                "omnirt.cli.main",
                "--controller",
                second.address,
                "sessions",
                "list",
            ]
            shown = await asyncio.to_thread(subprocess.run, [*argv, "--json"], capture_output=True, text=True)
            assert json.loads(shown.stdout)[0]["session_id"] == ready.session_id, shown.stderr
            session.send(END)
            assert (await session.read()).closed.reason == "ended"
            for _ in range(100):
                if not await asyncio.to_thread(listed, second):
                    break
                await asyncio.sleep(0.05)
            assert await asyncio.to_thread(listed, second) == []

    asyncio.run(scenario())
