"""A rolling restart of the controllers under load: nothing lost, nothing doubled, no error.

Two controllers share one Redis; two null workers and the SDK's clients reach them through one
target that names both (`ipv4:A,B`, as a Kubernetes Service's endpoints would), the clients with
round-robin. While four threads keep sending short Generate and Submit-then-wait calls, each
with its own idempotency key, controller A is stopped with SIGTERM and started again on its
port, then B. The shutting-down controller refuses new calls UNAVAILABLE with a RetryInfo
(the SDK sends them again, to the other), ends its watch streams (the SDK resumes them after
their last event on the other), lets the calls in flight finish, and tells its workers to
reconnect. Every call returns its result, and each idempotency key names exactly one job, which
succeeded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import omnirt
from tests.daemons import Controller, RedisServer, Worker, wait_for

GRACE_S = 5
FLAGS = ("--shutdown-grace-s", str(GRACE_S), "--heartbeat-interval-ms", "500", "--lease-timeout-ms", "3000")
# Each job: 4 steps of 40 ms (the null model sleeps when asked).
REQUEST = {"model": "null", "prompt": "steady", "num_inference_steps": 4, "extra": {"sleep_ms_per_step": 40}}


@pytest.fixture
def cluster(log_dir: Path, model_dir: Path) -> Iterator[tuple[RedisServer, list[Controller], str]]:
    redis = RedisServer(log_dir).start()
    store = ("--store", redis.url)
    controllers = [Controller(log_dir, *store, *FLAGS).start() for _ in range(2)]
    target = "ipv4:" + ",".join(c.address for c in controllers)
    workers = [
        Worker(
            log_dir,
            target,
            f"w-roll-{i}",
            model_dir,
            "--models",
            "null",
            "--slots",
            "4",
            "--reconnect-max-s",
            "0.5",
        ).start()
        for i in range(2)
    ]
    try:
        wait_for(lambda: len(set().union(*(c.worker_ids() for c in controllers))) == 2, 60, "both workers")
        yield redis, controllers, target
    finally:
        for worker in workers:
            worker.stop()
        for controller in controllers:
            controller.stop()
        redis.stop()


def restart(controllers: list[Controller], index: int, log_dir: Path, store: tuple[str, ...]) -> None:
    old = controllers[index]
    assert old.stop(timeout=GRACE_S + 20) == 0, old.log_tail()
    controllers[index] = Controller(log_dir, *store, *FLAGS, port=old.port).start()


def test_a_rolling_restart_of_both_controllers_under_load(
    cluster: tuple[RedisServer, list[Controller], str], log_dir: Path
) -> None:
    redis, controllers, target = cluster
    store = ("--store", redis.url)
    stop = threading.Event()
    calls: list[tuple[str, str, str]] = []  # (kind, idempotency key, job id)
    failures: list[str] = []
    lock = threading.Lock()

    def load(n: int) -> None:
        with omnirt.Client(target, options=[("grpc.lb_policy_name", "round_robin")], timeout=60) as client:
            i = 0
            while not stop.is_set():
                key = f"roll-{n}-{i}-{uuid.uuid4().hex[:8]}"
                kind = "generate" if i % 2 else "submit"
                try:
                    if kind == "generate":
                        job_id = client.generate(**REQUEST, idempotency_key=key).job_id
                    else:
                        job = client.submit(**REQUEST, idempotency_key=key)
                        job_id = client.wait(job.id, timeout=60).job_id
                except Exception as exc:  # what reached the caller: the test fails on any
                    with lock:
                        failures.append(f"{kind} {key}: {type(exc).__name__}: {exc}")
                    return
                with lock:
                    calls.append((kind, key, job_id))
                i += 1

    with ThreadPoolExecutor(4) as pool:
        running = [pool.submit(load, n) for n in range(4)]
        time.sleep(1.0)
        for index in (0, 1):
            done_before = len(calls)
            restart(controllers, index, log_dir, store)
            time.sleep(1.5)  # the restarted one takes calls again, and a few go through it
            assert len(calls) > done_before, "calls went on while the controller restarted"
        stop.set()
        for future in running:
            future.result(timeout=120)

    assert failures == [], failures
    assert len(calls) >= 20
    with omnirt.Client(controllers[0].address) as client:
        jobs = client.list_jobs(model="null")
    by_key: dict[str, list[omnirt.Job]] = {}
    for job in jobs:
        by_key.setdefault(job.idempotency_key, []).append(job)
    for kind, key, job_id in calls:
        assert [j.id for j in by_key.get(key, [])] == [job_id], f"{kind} {key}: one job, the one answered"
        assert by_key[key][0].state is omnirt.JobState.SUCCEEDED
    assert not any(j.state in (omnirt.JobState.QUEUED, omnirt.JobState.RUNNING) for j in jobs), "none stuck"
    # The controllers said what they did: the workers were told to reconnect, never lost.
    for controller in controllers:
        assert "worker lost" not in controller.log(), controller.log_tail()
    assert "worker told to reconnect" in controllers[0].log()


def test_shutdown_over_http_and_for_the_calls_the_grace_cannot_wait_for(
    log_dir: Path, model_dir: Path
) -> None:
    """One controller (memory) with a 2 s grace: gRPC health says NOT_SERVING and /healthz 503
    at once, a new call is refused UNAVAILABLE with a RetryInfo (HTTP: 503 with Retry-After), a
    WatchJob and an SSE stream end saying to reconnect, and a Generate still running when the
    grace ends gets UNAVAILABLE with a RetryInfo; its worker is told to reconnect and says so,
    and the controller exits 0."""
    controller = Controller(log_dir, "--shutdown-grace-s", "2", http=True).start()
    worker = Worker(
        log_dir, controller.address, "w-grace", model_dir, "--models", "null", "--slots", "2"
    ).start()
    slow = {"model": "null", "prompt": "slow", "num_inference_steps": 30, "extra": {"sleep_ms_per_step": 300}}
    try:
        controller.wait_worker("w-grace")
        outcome: list[BaseException] = []

        def generate() -> None:
            with controller.client(retries=0) as client:
                try:
                    client.generate(**slow)
                except BaseException as exc:  # what the caller gets
                    outcome.append(exc)

        caller = threading.Thread(target=generate)
        caller.start()
        with httpx.Client(base_url=controller.http, timeout=30) as http:
            watched = http.post("/v1/jobs", json=slow).json()["job"]["id"]
            with (
                http.stream("GET", f"/v1/jobs/{watched}/events") as events,
                controller.client(retries=0) as client,
            ):
                lines = events.iter_lines()
                assert next(line for line in lines if line.startswith("data:"))  # the stream is open
                wait_for(lambda: client.get_job(watched).state is omnirt.JobState.RUNNING, 30, "running")
                watch = client.watch(watched)  # and a gRPC one
                next(iter(watch))
                controller.signal(15)  # SIGTERM
                rest = "\n".join(lines)
                with grpc.insecure_channel(controller.address) as channel:
                    check = health_pb2_grpc.HealthStub(channel).Check
                    serving = check(health_pb2.HealthCheckRequest(), timeout=5).status
                assert serving == health_pb2.HealthCheckResponse.NOT_SERVING
                with pytest.raises(omnirt.errors.Unavailable) as refused:
                    client.get_job(watched)
                assert "shutting down" in str(refused.value) and refused.value.retry_after_s
                with pytest.raises(omnirt.errors.Unavailable) as ended:
                    for _ in watch:
                        pass
                assert "controller shutting down, reconnect" in str(ended.value)
            assert "event: error" in rest and "controller shutting down, reconnect" in rest, rest
            health = http.get("/healthz")
            assert health.status_code == 503 and health.json()["reason"] == "shutting down"
            refused = http.post("/v1/jobs", json=slow)
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "UNAVAILABLE"
            assert "shutting down" in refused.json()["error"]["message"]
        caller.join(30)
        [error] = outcome
        assert isinstance(error, omnirt.errors.Unavailable), error
        assert "shut down before the call finished" in str(error) and error.retry_after_s
        assert controller.wait(30) == 0
        assert "worker told to reconnect" in controller.log()
        wait_for(
            lambda: "is shutting down; reconnecting" in worker.log(), 10, "the worker to say it reconnects"
        )
    finally:
        worker.stop()
        controller.stop()
