"""The worker's probes on its `--metrics` listener: `/readyz` follows the controller stream,
`/livez` the process (a controller restart must not restart the workers), and a stuck event
loop is not alive.

A real controller, stopped and started again on its port, and a real `null` worker.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

from omnirt.worker.telemetry import LOOP_ANSWER_S, WorkerTelemetry
from tests.daemons import Controller, Worker, free_port, wait_for


def probe(url: str) -> tuple[int, dict[str, object]]:
    """(HTTP status, JSON body) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_readyz_follows_the_controller_stream_while_livez_stays_up(log_dir: Path, model_dir: Path) -> None:
    controller = Controller(log_dir).start()
    base = f"http://127.0.0.1:{free_port()}"
    worker = Worker(
        log_dir,
        controller.address,
        "w-health",
        model_dir,
        "--models=null",
        "--no-preload",
        "--reconnect-max-s=0.5",
        f"--metrics={base.removeprefix('http://')}",
    ).start()
    second: Controller | None = None
    try:
        controller.wait_worker("w-health")
        wait_for(lambda: probe(f"{base}/readyz")[0] == 200, 10, "/readyz to answer 200")
        assert probe(f"{base}/livez") == (200, {"status": "SERVING"})

        assert controller.stop() == 0
        wait_for(lambda: probe(f"{base}/readyz")[0] == 503, 10, "/readyz to answer 503")
        status, body = probe(f"{base}/readyz")
        assert status == 503 and controller.address in str(body["reason"]), body
        assert probe(f"{base}/livez")[0] == 200, "a controller outage must not restart the worker"

        second = Controller(log_dir, port=controller.port).start()
        wait_for(lambda: probe(f"{base}/readyz")[0] == 200, 15, "/readyz to answer 200 after the restart")
        assert worker.alive() and probe(f"{base}/livez")[0] == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            assert b"omnirt_worker_own_slots" in response.read()
        assert probe(f"{base}/readz")[0] == 404, "a mistyped probe path must fail, not pass"
    finally:
        worker.stop()
        if second is not None:
            second.stop()
        controller.stop()


def test_livez_fails_while_the_event_loop_is_stuck() -> None:
    """The listener answers from its own threads: /livez asks the worker's event loop."""
    port = free_port()

    async def main() -> tuple[int, int, int]:
        WorkerTelemetry("w", 1, lambda: 0, list).serve(f"127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}/livez"
        healthy = (await asyncio.to_thread(probe, url))[0]
        stuck = asyncio.get_running_loop().run_in_executor(None, probe, url)
        time.sleep(LOOP_ANSWER_S + 0.5)  # blocks the loop, as a synchronous call in it would
        during = (await stuck)[0]
        after = (await asyncio.to_thread(probe, url))[0]
        return healthy, during, after

    assert asyncio.run(main()) == (200, 503, 200)
