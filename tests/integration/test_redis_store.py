"""The Redis job store: crash recovery, two controllers on one Redis, Redis failures, TTLs.

Real `redis-server` processes on free ports (nothing on disk), real controllers and `null`
workers. The scheduler's own tests also run on this store (test_scheduler.py, `[redis]`).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import omnirt
from omnirt import errors
from omnirt.types import EventKind, JobState
from tests.daemons import Controller, RedisServer, Worker, free_port, wait_for

SLOW_NULL = {"model": "null", "num_inference_steps": 200, "extra": {"sleep_ms_per_step": 25}}


@pytest.fixture
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    yield server
    server.stop()


def null_worker(
    log_dir: Path, model_dir: Path, controller: Controller, worker_id: str, *extra: str
) -> Worker:
    worker = Worker(log_dir, controller.address, worker_id, model_dir, "--models", "null", *extra).start()
    controller.wait_worker(worker_id)
    return worker


def health(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service=service)
        reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=2)
        return int(reply.status)


def results(client: omnirt.Client, job_id: str) -> int:
    return sum(1 for e in client.watch(job_id) if e.kind is EventKind.RESULT)


def test_a_controller_killed_under_load_loses_no_job_and_delivers_one_result_each(
    redis_server: RedisServer, log_dir: Path, model_dir: Path
) -> None:
    store = ("--store", redis_server.url, "--lease-timeout-ms", "2000")
    first = Controller(log_dir, *store).start()
    worker = null_worker(log_dir, model_dir, first, "w-crash", "--slots", "4")
    try:
        with omnirt.Client(first.address, timeout=10) as client:
            jobs = [
                client.submit(
                    model="null",
                    prompt=f"job {i}",
                    num_inference_steps=4,
                    extra={"sleep_ms_per_step": 10},
                    labels={"n": str(i)},
                )
                for i in range(300)
            ]
            # Kill it mid-load: some jobs done, some running, most still queued.
            wait_for(
                lambda: len(client.list_jobs(states=[JobState.SUCCEEDED])) >= 30,
                120,
                "30 jobs to finish",
            )
        first.signal(signal.SIGKILL)
        first.wait(10)
        second = Controller(log_dir, *store, port=first.port).start()
        try:
            with omnirt.Client(second.address, timeout=30) as client:
                finals = [client.wait(j.id, timeout=180) for j in jobs]
                assert len(finals) == 300
                states = {client.get_job(j.id).state for j in jobs}
                assert states == {JobState.SUCCEEDED}, states
                assert [results(client, j.id) for j in jobs] == [1] * 300, "exactly one result per job"
                assert {f.job_id for f in finals} == {j.id for j in jobs}
        finally:
            second.stop()
    finally:
        worker.stop()
        if first.alive():
            first.stop()


def test_two_controllers_share_jobs_workers_cancels_and_artifacts(
    redis_server: RedisServer, log_dir: Path, model_dir: Path, tmp_path: Path
) -> None:
    shared = (
        "--store",
        redis_server.url,
        "--inline-limit-bytes",
        "1",
        "--store-artifact-limit-bytes",
        "1",
        "--artifact-dir",
        str(tmp_path / "artifacts"),
    )
    a = Controller(log_dir, *shared).start()
    b = Controller(log_dir, *shared).start()
    worker = null_worker(
        log_dir, model_dir, b, "w-on-b", "--slots", "2", "--log-json", "--log-level", "DEBUG"
    )
    try:
        with omnirt.Client(a.address, timeout=30) as on_a, omnirt.Client(b.address, timeout=30) as on_b:
            # Submitted to A, run by B's worker, read and watched through B; the caller's trace
            # goes on through B to the worker.
            trace_id = secrets.token_hex(16)
            traced = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)
            with omnirt.Client(a.address, timeout=30, metadata=traced) as traced_a:
                result = traced_a.generate(model="null", prompt="through a", seed=3)
            assert result.report.worker_id == "w-on-b"
            assert result.report.trace_id == trace_id
            time.sleep(0.3)  # the worker's last lines reach its log file
            lines = [json.loads(line) for line in worker.log().splitlines() if line.startswith("{")]
            about_job = [line for line in lines if result.job_id in line.get("job_id", "")]
            assert about_job and {line.get("trace_id") for line in about_job} == {trace_id}
            job = on_b.get_job(result.job_id)
            assert job.state is JobState.SUCCEEDED and job.worker_id == "w-on-b"
            events = list(on_b.watch(result.job_id))
            assert [e.sequence for e in events] == list(range(1, len(events) + 1))
            assert [e.sequence for e in on_b.watch(result.job_id, after_sequence=2)] == [
                e.sequence for e in events[2:]
            ], "WatchJob resumes after the event it is given"
            # The artifact is over both limits: a reference in the result, bytes in the shared folder.
            artifact = result.artifacts[0]
            assert not artifact.data and artifact.uri
            data = on_b.download_artifact(result.job_id, 0)
            assert hashlib.sha256(data).hexdigest() == artifact.sha256
            assert (tmp_path / "artifacts" / result.job_id / "0").read_bytes() == data
            # Both controllers list the worker, wherever it is connected.
            assert "w-on-b" in {w.id for w in on_a.list_workers()}
            # ... with what its heartbeats say (its job count, its device), as B last listed it.
            wait_for(
                lambda: (
                    [(w.jobs_succeeded, w.device) for w in on_a.list_workers() if w.id == "w-on-b"]
                    == [(1, "cpu")]
                ),
                10,
                "A to list the worker's job count",
            )
            # A running job submitted to B is cancelled through A: B's worker stops it.
            slow = on_b.submit(prompt="cancel me", **SLOW_NULL)
            wait_for(lambda: on_a.get_job(slow.id).state is JobState.RUNNING, 30, "the slow job to run")
            assert on_a.cancel(slow.id).cancelled is True
            assert on_b.get_job(slow.id).state is JobState.CANCELLED
            slow_events = list(on_a.watch(slow.id))
            steps = [e for e in slow_events if e.kind is EventKind.PROGRESS]
            assert len(steps) < 200, "the worker stopped before the end"
            # The worker is free again: more jobs submitted to A complete.
            assert on_a.generate(model="null", prompt="after the cancel").report.worker_id == "w-on-b"
            # An unknown job is NOT_FOUND on both.
            for client in (on_a, on_b):
                with pytest.raises(errors.JobNotFound):
                    client.get_job("job-0000000000000000")
    finally:
        worker.stop()
        a.stop()
        b.stop()


def test_redis_down_means_unavailable_and_not_serving_until_it_is_back(
    redis_server: RedisServer, log_dir: Path, model_dir: Path
) -> None:
    http_port = free_port()
    controller = Controller(log_dir, "--store", redis_server.url, "--http", f"127.0.0.1:{http_port}").start()
    worker = null_worker(log_dir, model_dir, controller, "w-redis-down")
    healthz = f"http://127.0.0.1:{http_port}/healthz"
    serving = health_pb2.HealthCheckResponse.SERVING
    try:
        with omnirt.Client(controller.address, timeout=10) as client:
            assert client.generate(model="null", prompt="before").job_id
            redis_server.stop()
            with pytest.raises(errors.Unavailable) as info:
                client.submit(model="null", prompt="nowhere to keep it")
            assert "job store" in str(info.value)
            wait_for(lambda: health(controller.address) != serving, 10, "health to report NOT_SERVING")
            assert httpx.get(healthz).status_code == 503
            # Not ready, but alive: a liveness probe must not restart it for Redis' sake.
            assert health(controller.address, "omnirt.liveness") == serving
            assert controller.alive()

            redis_server.start()
            wait_for(lambda: health(controller.address) == serving, 20, "health to report SERVING again")
            assert httpx.get(healthz).status_code == 200
            result = client.generate(model="null", prompt="after", timeout=30)
            assert result.report.worker_id == "w-redis-down"
    finally:
        worker.stop()
        controller.stop()


def test_finished_jobs_expire_after_the_ttl(
    redis_server: RedisServer, log_dir: Path, model_dir: Path
) -> None:
    controller = Controller(log_dir, "--store", redis_server.url, "--job-ttl-s", "1").start()
    worker = null_worker(log_dir, model_dir, controller, "w-ttl")
    try:
        with omnirt.Client(controller.address, timeout=10) as client:
            result = client.generate(model="null", prompt="short-lived")
            assert client.get_job(result.job_id).state is JobState.SUCCEEDED
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    client.get_job(result.job_id)
                except errors.JobNotFound:
                    break
                time.sleep(0.2)
            else:
                pytest.fail("the finished job outlived its TTL")
            assert result.job_id not in {j.id for j in client.list_jobs()}
            with pytest.raises(errors.JobNotFound):
                list(client.watch(result.job_id))
    finally:
        worker.stop()
        controller.stop()
