"""Workers and the controller come and go: reconnects, restarts and drain on SIGTERM."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

import omnirt
from omnirt.types import EventKind, JobState
from tests.daemons import Controller, Worker, wait_for

# Workers whose tests act on a job mid-run once its first PROGRESS arrives.
PROMPT_EVENTS = ("--progress-interval-ms", "0")


@pytest.fixture
def own_controller(log_dir: Path) -> Controller:
    daemon = Controller(log_dir, "--lease-timeout-ms", "3000").start()
    yield daemon  # type: ignore[misc]
    daemon.stop()


def generate_once(address: str, seed: int = 1) -> omnirt.GenerateResult:
    with omnirt.Client(address) as client:
        return client.generate(model="tiny-sd", prompt="resilience", seed=seed, timeout=120)


def test_a_killed_worker_restarted_reconnects_and_serves(
    own_controller: Controller, log_dir: Path, model_dir: Path
) -> None:
    worker = Worker(log_dir, own_controller.address, "w-kill", model_dir).start()
    try:
        own_controller.wait_worker("w-kill")
        assert generate_once(own_controller.address).artifacts
        worker.signal(signal.SIGKILL)
        worker.wait(10)
        own_controller.wait_worker("w-kill", present=False, timeout=15)
        worker.start()
        own_controller.wait_worker("w-kill")
        assert generate_once(own_controller.address, seed=2).artifacts
    finally:
        worker.stop()


def test_the_worker_reconnects_after_a_controller_restart(log_dir: Path, model_dir: Path) -> None:
    first = Controller(log_dir).start()
    worker = Worker(log_dir, first.address, "w-reconnect", model_dir).start()
    try:
        first.wait_worker("w-reconnect")
        assert first.stop() == 0, "the controller exits cleanly on SIGTERM"
        second = Controller(log_dir, port=first.port).start()
        try:
            second.wait_worker("w-reconnect", timeout=30)
            assert generate_once(second.address).report.worker_id == "w-reconnect"
            assert worker.alive()
        finally:
            second.stop()
    finally:
        worker.stop()


def test_sigterm_drains_the_worker(own_controller: Controller, log_dir: Path, model_dir: Path) -> None:
    # Events at once: its first PROGRESS comes after step 1, not with the run's first 0.25 s
    # (by then a short job on a fast CPU is nearly done, and would end before the drain shows).
    worker = Worker(log_dir, own_controller.address, "w-drain", model_dir, *PROMPT_EVENTS).start()
    own_controller.wait_worker("w-drain")
    with omnirt.Client(own_controller.address) as client:
        client.generate(
            model="tiny-sd", prompt="load first", seed=1, timeout=120
        )  # warm: the next run is all steps
        job = client.submit(model="tiny-sd", prompt="a long one", seed=3, num_inference_steps=100)
        events = client.watch(job.id, timeout=120)
        for event in events:
            if event.kind is EventKind.PROGRESS:
                break  # it is running now
        worker.signal(signal.SIGTERM)
        wait_for(
            lambda: any(w.state == 2 for w in own_controller.workers()), 10, "the worker to report draining"
        )
        queued_after = client.submit(model="tiny-sd", prompt="must wait", seed=4)
        assert worker.wait(60) == 0, "a drained worker exits 0"
        finished = client.get_job(job.id)
        assert finished.state is JobState.SUCCEEDED, finished.error
        # nothing new was given to the draining worker
        time.sleep(0.3)
        assert client.get_job(queued_after.id).state is JobState.QUEUED
        own_controller.wait_worker("w-drain", present=False, timeout=10)
        client.cancel(queued_after.id)
    # A clean drain is not an incident: INFO "worker drained", never WARNING "worker lost".
    lines = [line for line in own_controller.log().splitlines() if "worker_id=w-drain" in line]
    assert any("INFO" in line and "worker drained" in line for line in lines), lines
    assert not any("worker lost" in line for line in lines), lines


def test_a_silent_worker_loses_its_lease_and_its_job_finishes_elsewhere(
    own_controller: Controller, log_dir: Path, model_dir: Path
) -> None:
    """SIGSTOP freezes a worker with its stream open: no heartbeats, so the lease (3 s) expires."""
    frozen = Worker(log_dir, own_controller.address, "w-frozen", model_dir, *PROMPT_EVENTS).start()
    spare: Worker | None = None
    try:
        own_controller.wait_worker("w-frozen")
        with omnirt.Client(own_controller.address) as client:
            client.generate(model="tiny-sd", prompt="warm", seed=1, timeout=120)
            job = client.submit(model="tiny-sd", prompt="interrupted", seed=8, num_inference_steps=100)
            for event in client.watch(job.id, timeout=120):
                if event.kind is EventKind.PROGRESS:
                    break
            frozen.signal(signal.SIGSTOP)
            spare = Worker(log_dir, own_controller.address, "w-spare", model_dir).start()
            result = client.wait(job.id, timeout=180)
            assert result.report.worker_id == "w-spare"
            final = client.get_job(job.id)
            assert final.attempts == 2
            frozen.signal(signal.SIGCONT)
            # the thawed worker reconnects; whatever it sends about the old run is ignored
            own_controller.wait_worker("w-frozen", timeout=30)
            time.sleep(1)
            events = list(client.watch(job.id))
            assert sum(1 for e in events if e.kind is EventKind.RESULT) == 1
            assert [e.state for e in events if e.state][-1] is JobState.SUCCEEDED
            requeued = [e for e in events if e.state is JobState.QUEUED and e.error]
            assert requeued and "no heartbeat" in requeued[0].error.message
    finally:
        frozen.signal(signal.SIGCONT)
        frozen.stop()
        if spare:
            spare.stop()


def test_a_job_waits_for_a_worker_that_serves_its_model(
    own_controller: Controller, log_dir: Path, model_dir: Path
) -> None:
    with omnirt.Client(own_controller.address) as client:
        job = client.submit(model="tiny-sd", prompt="patience", seed=6)
        time.sleep(0.5)
        waiting = client.get_job(job.id)
        assert waiting.state is JobState.QUEUED
        assert waiting.waiting_reason == (
            "no connected worker serves model tiny-sd (execution mode legacy_call); "
            "the job fails after 60 s without one (--unserved-wait-s)"
        )
        worker = Worker(log_dir, own_controller.address, "w-late", model_dir).start()
        try:
            result = client.wait(job.id, timeout=120)
            assert result.report.worker_id == "w-late" and result.report.queue_wait_ms >= 500
        finally:
            worker.stop()
