"""A controller killed mid-job and restarted: its worker adopts the job it is offered again, and
the controller's view of the worker's slots heals from what the worker says it runs.

Real `redis-server`, real controllers (one `kill -9`ed and restarted on its port) and a real
`null` worker.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import omnirt
from omnirt.types import EventKind, JobState
from tests.daemons import Controller, RedisServer, Worker, wait_for

# About 16 s of steps: long enough to outlive a kill, a lease expiry and a restart.
SLOW_NULL = {"model": "null", "num_inference_steps": 320, "extra": {"sleep_ms_per_step": 50}}


@pytest.fixture
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    yield server
    server.stop()


def busy_slots(controller: Controller, worker_id: str) -> int:
    return sum(w.busy_slots for w in controller.workers() if w.id == worker_id)


def test_a_job_requeued_after_its_controller_crashed_is_adopted_by_the_worker_still_running_it(
    redis_server: RedisServer, log_dir: Path, model_dir: Path
) -> None:
    store = ("--store", redis_server.url, "--lease-timeout-ms", "2000", "--heartbeat-interval-ms", "500")
    first = Controller(log_dir, *store).start()
    other = Controller(log_dir, *store).start()  # no worker: it only requeues the dead one's job
    worker = Worker(
        log_dir, first.address, "w-adopt", model_dir, "--models", "null", "--reconnect-max-s", "0.5"
    ).start()
    try:
        first.wait_worker("w-adopt")
        with omnirt.Client(other.address, timeout=10) as client:
            job = client.submit(prompt="outlives its controller", **SLOW_NULL)
            for event in client.watch(job.id, timeout=60):
                if event.kind is EventKind.PROGRESS:
                    break  # running on w-adopt
            first.signal(signal.SIGKILL)
            first.wait(10)
            wait_for(lambda: client.get_job(job.id).state is JobState.QUEUED, 30, "the lease to expire")
            first.start()  # same port: the worker reconnects to it and is offered the job again
            client.wait(job.id, timeout=90)
            final = client.get_job(job.id)
            assert final.state is JobState.SUCCEEDED, final.error
            assert final.attempts == 2
            assert sum(1 for e in client.watch(job.id) if e.kind is EventKind.RESULT) == 1
            wait_for(lambda: busy_slots(first, "w-adopt") == 0, 10, "the worker's slot to be free")
            after = client.generate(model="null", prompt="next", num_inference_steps=2, timeout=30)
            assert after.report.worker_id == "w-adopt"
            time.sleep(1.5)  # a few heartbeats: nothing is released that should not be
            assert busy_slots(first, "w-adopt") == 0
    finally:
        worker.stop()
        other.stop()
        if first.alive():
            first.stop()
