"""Rows, not only slots, through real daemons: a worker whose step engine runs a batch takes a
compatible job beside its only slot, and the job joins that batch at the next step.

A worker with `--slots 1` runs a long tiny-sd job; a second tiny-sd job of the same size is
dispatched to it at once (it joins the batch, `joins_batch`), while one of another size waits for
the slot, as it always did. On Redis two controllers share one Redis and the jobs come in through
the one without workers, so the join is decided in the CLAIM_JOIN script.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import omnirt
from tests.daemons import Controller, RedisServer, Worker, wait_for

LONG = 100  # steps of the running job (the catalog's most), a few milliseconds each on tiny-sd
SIZE = {"width": 128, "height": 128}  # slower steps than the default 64x64: a wider window


@dataclass
class Rows:
    back: Controller  # holds the worker
    front: Controller  # where the jobs come in (the same one in memory)


@pytest.fixture(scope="module", params=["memory", "redis"])
def rows(request: pytest.FixtureRequest, log_dir: Path, model_dir: Path) -> Iterator[Rows]:
    redis = RedisServer(log_dir).start() if request.param == "redis" else None
    store = ("--store", redis.url) if redis else ()
    back = Controller(log_dir, *store).start()
    front = Controller(log_dir, *store).start() if redis else back
    worker = Worker(log_dir, back.address, "w-rows", model_dir, "--slots", "1").start()
    try:
        back.wait_worker("w-rows")
        with omnirt.Client(back.address) as client:
            client.generate(model="tiny-sd", prompt="warm up", num_inference_steps=2, timeout=120)
        yield Rows(back, front)
    finally:
        worker.stop()
        for controller in {back, front}:
            controller.stop()
        if redis:
            redis.stop()


def running_with_progress(client: omnirt.Client, job_id: str) -> None:
    def stepping() -> bool:
        job = client.get_job(job_id)
        return job.state is omnirt.JobState.RUNNING and job.progress is not None and job.progress.step >= 2

    wait_for(stepping, timeout=60, what=f"job {job_id} taking steps")


def test_a_compatible_job_joins_the_running_batch_beside_the_only_slot(rows: Rows) -> None:
    with omnirt.Client(rows.front.address) as client:
        [worker] = client.list_workers()
        assert worker.slots == 1 and worker.step_rows >= 4
        assert "StableDiffusionPipeline" in worker.step_pipelines
        long = client.submit(model="tiny-sd", prompt="a long one", num_inference_steps=LONG, seed=1, **SIZE)
        running_with_progress(client, long.id)
        # Another size cannot join: it waits for the slot. The same size joins at once.
        other = client.submit(model="tiny-sd", prompt="wide", width=96, num_inference_steps=2, seed=2)
        joining = client.submit(model="tiny-sd", prompt="a short one", num_inference_steps=4, seed=3, **SIZE)
        joined = client.wait(joining.id, timeout=120)
        assert client.get_job(long.id).state is omnirt.JobState.RUNNING, "it ran while the long one ran"
        assert client.get_job(other.id).state is omnirt.JobState.QUEUED, "another size waits for the slot"
        engine = joined.report.config_resolved["step_engine"]
        assert engine["used"] and engine["joined_at_forward"] >= 2 and engine["peak_rows"] == 4
        long_result = client.wait(long.id, timeout=300)
        assert long_result.report.config_resolved["step_engine"]["peak_rows"] == 4
        assert (
            client.wait(other.id, timeout=120).report.config_resolved["step_engine"]["joined_at_forward"] == 0
        )


def test_the_slot_and_the_rows_are_free_again_after(rows: Rows) -> None:
    with omnirt.Client(rows.back.address) as client:
        deadline = time.monotonic() + 30
        while client.list_workers()[0].busy_slots and time.monotonic() < deadline:
            time.sleep(0.05)
        [worker] = client.list_workers()
        assert worker.busy_slots == 0 and not worker.running_job_ids
        # A lone job takes the slot and runs alone, as before.
        result = client.generate(model="tiny-sd", prompt="alone", num_inference_steps=2, seed=4, timeout=60)
        assert result.report.config_resolved["step_engine"]["peak_rows"] == 2


def test_a_cancelled_joined_job_ends_alone(rows: Rows) -> None:
    with omnirt.Client(rows.front.address) as client:
        long = client.submit(model="tiny-sd", prompt="a long one", num_inference_steps=LONG, seed=5, **SIZE)
        running_with_progress(client, long.id)
        joining = client.submit(model="tiny-sd", prompt="cancel me", num_inference_steps=LONG, seed=6, **SIZE)
        running_with_progress(client, joining.id)
        client.cancel(joining.id)
        with pytest.raises(omnirt.errors.Cancelled):
            client.wait(joining.id, timeout=60)
        assert client.wait(long.id, timeout=300).report.config_resolved["step_engine"]["peak_rows"] == 4


def test_a_joined_jobs_deadline_ends_it_alone(rows: Rows) -> None:
    with omnirt.Client(rows.front.address) as client:
        long = client.submit(model="tiny-sd", prompt="a long one", num_inference_steps=LONG, seed=9, **SIZE)
        running_with_progress(client, long.id)
        late = client.submit(
            model="tiny-sd", prompt="out of time", num_inference_steps=LONG, seed=10, timeout_ms=400, **SIZE
        )
        with pytest.raises(omnirt.errors.DeadlineExceeded):
            client.wait(late.id, timeout=60)
        seen = [e for e in client.watch(late.id) if e.kind is omnirt.EventKind.PROGRESS]
        assert seen, "it ran (joined the batch) before its deadline"
        assert client.wait(long.id, timeout=300).report.config_resolved["step_engine"]["peak_rows"] == 4


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_a_worker_killed_mid_batch_has_every_row_retried_elsewhere_once(
    store: str, log_dir: Path, model_dir: Path
) -> None:
    redis = RedisServer(log_dir).start() if store == "redis" else None
    flags = ("--store", redis.url) if redis else ()
    controller = Controller(log_dir, "--lease-timeout-ms", "3000", *flags).start()
    doomed = Worker(log_dir, controller.address, f"w-doomed-{store}", model_dir, "--slots", "1").start()
    spare: Worker | None = None
    try:
        controller.wait_worker(f"w-doomed-{store}")
        with omnirt.Client(controller.address) as client:
            long = client.submit(
                model="tiny-sd", prompt="a long one", num_inference_steps=LONG, seed=7, **SIZE
            )
            running_with_progress(client, long.id)
            joined = client.submit(model="tiny-sd", prompt="joined", num_inference_steps=LONG, seed=8, **SIZE)
            running_with_progress(client, joined.id)
            assert client.get_job(joined.id).worker_id == f"w-doomed-{store}"
            doomed.signal(signal.SIGKILL)
            doomed.wait(10)
            # Both rows go back to the queue, and run on the next worker that serves the model.
            spare = Worker(log_dir, controller.address, f"w-spare-{store}", model_dir, "--slots", "2").start()
            results = [client.wait(job.id, timeout=300) for job in (long, joined)]
            for job, result in zip((long, joined), results, strict=True):
                assert result.report.worker_id == f"w-spare-{store}"
                final = client.get_job(job.id)
                assert final.state is omnirt.JobState.SUCCEEDED and final.attempts == 2
                results_seen = [e for e in client.watch(job.id) if e.kind is omnirt.EventKind.RESULT]
                assert len(results_seen) == 1, "exactly one result"
    finally:
        if spare is not None:
            spare.stop()
        doomed.stop()
        controller.stop()
        if redis:
            redis.stop()
