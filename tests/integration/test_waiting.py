"""Waiting explains itself: a job for a model no connected worker serves says why it waits, how
many are ahead and its step total, and fails FAILED_PRECONDITION after `--unserved-wait-s`
(0 refuses it at submit), while the models of `--expected-models` (a pool that scales from
zero) wait on. Through real daemons, on both engines, and `omnirtctl` in a terminal.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import omnirt
from omnirt.errors import FailedPrecondition
from tests.daemons import Controller, Worker, job_store

WAIT_S = 1.5  # --unserved-wait-s of the module's controller
UNSERVED = "tiny-sdxl"  # no worker serves it
EXPECTED = "tiny-sd3"  # no worker serves it either, but the deployment says one will


@pytest.fixture(scope="module", params=["memory", "redis"])
def controller(request: pytest.FixtureRequest, log_dir: Path, model_dir: Path) -> Iterator[Controller]:
    with job_store(request.param, log_dir) as store:
        flags = ("--unserved-wait-s", str(WAIT_S), "--expected-models", EXPECTED)
        daemon = Controller(log_dir, *store, *flags).start()
        worker = Worker(log_dir, daemon.address, "w-null", model_dir, "--models", "null").start()
        try:
            daemon.wait_worker("w-null")
            yield daemon
        finally:
            worker.stop()
            daemon.stop()


def test_a_job_no_worker_serves_says_why_then_fails_naming_the_model(controller: Controller) -> None:
    with omnirt.Client(controller.address) as client:
        job = client.submit(model=UNSERVED, prompt="a fox", num_inference_steps=3)
        assert job.progress is not None and job.progress.total_steps == 3, "the step total is known at once"
        queued = client.get_job(job.id)
        assert queued.state is omnirt.JobState.QUEUED
        assert f"no connected worker serves model {UNSERVED}" in queued.waiting_reason
        assert f"fails after {WAIT_S:g} s" in queued.waiting_reason
        started = time.monotonic()
        with pytest.raises(FailedPrecondition) as raised:
            client.wait(job.id, timeout=30)
        assert raised.value.field == "model"
        assert f"no connected worker served model {UNSERVED}" in str(raised.value)
        assert "--unserved-wait-s" in str(raised.value)
        assert time.monotonic() - started < 15
        failed = client.get_job(job.id)
        assert failed.state is omnirt.JobState.FAILED and failed.error is not None
        assert failed.error.code == "FAILED_PRECONDITION"
        # A served model is not touched by the rule.
        assert client.generate(model="null", prompt="still fine").artifacts


def test_a_model_the_deployment_expects_waits_for_its_worker(controller: Controller) -> None:
    with omnirt.Client(controller.address) as client:
        job = client.submit(model=EXPECTED, prompt="patient", num_inference_steps=2)
        time.sleep(WAIT_S + 2.5)  # past the wait and the reaper's second
        waiting = client.get_job(job.id)
        assert waiting.state is omnirt.JobState.QUEUED, "an expected model's job waits for a worker to start"
        assert f"no connected worker serves model {EXPECTED}" in waiting.waiting_reason
        assert "fails after" not in waiting.waiting_reason
        assert client.cancel(job.id).cancelled


def test_zero_refuses_at_submit(log_dir: Path) -> None:
    refusing = Controller(log_dir, "--unserved-wait-s", "0", "--expected-models", EXPECTED).start()
    try:
        with omnirt.Client(refusing.address) as client:
            with pytest.raises(FailedPrecondition) as raised:
                client.submit(model=UNSERVED, prompt="no")
            assert raised.value.field == "model" and UNSERVED in str(raised.value)
            assert client.list_jobs() == [], "nothing was queued"
            expected = client.submit(model=EXPECTED, prompt="may wait")
            assert client.cancel(expected.id).cancelled
    finally:
        refusing.stop()


def run_in_terminal(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal as its stderr and stdout (as a person's shell would):
    its exit code and everything it wrote."""
    main, child = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=child, stderr=child, env=env)
    os.close(child)
    out = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(main)
    code = proc.wait(timeout=10)
    return code, out.decode(errors="replace")


def test_omnirtctl_shows_the_reason_and_the_step_total_then_the_error(
    controller: Controller, tmp_path: Path
) -> None:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    assert exe, "omnirtctl is installed beside this Python"
    env = {**os.environ, "OMNIRT_CONTROLLER": controller.address, "COLUMNS": "200", "TERM": "xterm"}
    argv = [exe, "generate", "-m", UNSERVED, "-p", "a fox", "--steps", "3", "-o", str(tmp_path)]
    code, out = run_in_terminal(argv, env, timeout=60)
    assert code != 0
    assert f"no connected worker serves model {UNSERVED}" in out, out
    assert "0/3" in out, "the bar shows the step total while the job waits"
    assert "FAILED_PRECONDITION" in out or "failed precondition" in out.lower(), out
    assert f"served model {UNSERVED}" in out
