"""A worker's job counts and device in `ListWorkers` (and `omnirtctl workers list`): the worker
counts the jobs it ran (a cancelled one is neither succeeded nor failed), and the numbers come
back with its Hello after the controller restarts.

A real controller, stopped and started again on its port, and a real `null` worker.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import omnirt
from omnirt import errors
from omnirt.types import JobState, WorkerInfo
from tests.daemons import Controller, Worker, wait_for
from tests.e2e.test_cli import omnirtctl


def listed(client: omnirt.Client, worker_id: str) -> WorkerInfo:
    (info,) = [w for w in client.list_workers() if w.id == worker_id]
    return info


def column(table: str, name: str, row_id: str) -> str:
    """The cell of column `name` in the row starting with `row_id` (print_table's layout)."""
    header, *rows = table.splitlines()
    start = header.index(name)
    (row,) = [r for r in rows if r.startswith(row_id + " ")]
    return row[start:].split("  ", 1)[0].strip()


def test_the_worker_counts_its_jobs_and_they_survive_a_controller_restart(
    log_dir: Path, model_dir: Path
) -> None:
    controller = Controller(log_dir).start()
    worker = Worker(
        log_dir,
        controller.address,
        "w-counts",
        model_dir,
        "--models=null",
        "--no-preload",
        "--reconnect-max-s=0.5",
    ).start()
    second: Controller | None = None
    try:
        controller.wait_worker("w-counts")
        with omnirt.Client(controller.address) as client:
            client.generate(model="null", prompt="one", timeout=30)
            client.generate(model="null", prompt="two", timeout=30)
            # Refused by the null pipeline on the worker, not by the controller's validation.
            with pytest.raises(errors.InvalidRequest, match="sleep_ms_per_step"):
                client.generate(model="null", prompt="bad", extra={"sleep_ms_per_step": -1}, timeout=30)
            wait_for(
                lambda: (
                    (listed(client, "w-counts").jobs_succeeded, listed(client, "w-counts").jobs_failed)
                    == (2, 1)
                ),
                10,
                "the heartbeat to report 2 succeeded and 1 failed",
            )
            assert listed(client, "w-counts").device == "cpu"

            # About 5 s of steps: cancelled once it runs.
            slow = client.submit(
                model="null", prompt="slow", num_inference_steps=100, extra={"sleep_ms_per_step": 50}
            )
            wait_for(lambda: client.get_job(slow.id).state is JobState.RUNNING, 10, "the slow job to run")
            client.cancel(slow.id)
            # One slot: this job runs after the cancelled run has ended and been counted.
            client.generate(model="null", prompt="three", timeout=30)
            wait_for(lambda: listed(client, "w-counts").jobs_succeeded == 3, 10, "3 succeeded")
            assert listed(client, "w-counts").jobs_failed == 1, "a cancelled job is not a failure"
            assert client.get_job(slow.id).state is JobState.CANCELLED

        table = omnirtctl(controller, "workers", "list").stdout
        assert column(table, "DEVICE", "w-counts") == "cpu", table
        assert column(table, "DONE/FAILED", "w-counts") == "3/1", table

        assert controller.stop() == 0
        second = Controller(log_dir, port=controller.port).start()
        second.wait_worker("w-counts", timeout=30)
        with omnirt.Client(second.address) as client:
            wait_for(lambda: listed(client, "w-counts").last_heartbeat_at is not None, 10, "a heartbeat")
            info = listed(client, "w-counts")  # the worker's counts, not this new controller's
            assert (info.jobs_succeeded, info.jobs_failed, info.device) == (3, 1, "cpu")
            client.generate(model="null", prompt="four", timeout=30)
            wait_for(lambda: listed(client, "w-counts").jobs_succeeded == 4, 10, "4 succeeded")
    finally:
        worker.stop()
        if second is not None:
            second.stop()
        controller.stop()
