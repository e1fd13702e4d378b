"""Redis frozen (SIGSTOP) under load: no job lost, none stuck, only UNAVAILABLE reaches a caller.

A stopped redis-server keeps its sockets: connections stay open, commands go into the kernel's
buffers and get no answer, as with a Redis stalled by a long fork, a swap storm or a paused VM.
The store's client gives up on a command after its `socket_timeout` (5 s,
controller/engines/redis/store.py), and redis-py retries a timed-out command once, on a fresh
connection that waits as long (a pooled connection idle for 5 s first waits on a health-check
PING): the controller meets an error 10 to 20 s into a freeze. The freeze here is 12 s, so the
upkeep's calls, which run each second, take the error path, and a caller's call does when it
started early in the freeze on a busy connection. A command the controller gave up on may still
run once Redis thaws (it was sent): a refused Submit may have left its job, which the same
idempotency key sent again finds.

One controller on the Redis, one null worker with four slots. Three threads submit short jobs,
each with its own idempotency key: one through the SDK's default retries, two with `retries=0`
so that the controller's own answer during the freeze reaches them; one longer job runs into
the freeze. The freeze runs once for the module (`frozen`); the tests read what it left.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import omnirt
from omnirt.types import JobState
from tests.daemons import Controller, RedisServer, Worker, wait_for

# Past the ~10 s after which the controller's busy connections give up (two 5 s timeouts).
FREEZE_S = 12.0
BEFORE_S, AFTER_S = 1.5, 2.0  # load before the freeze, and after the thaw
PACE_S = 0.15  # between one thread's calls: ~20 jobs/s offered to a worker that does ~40/s
CALL_TIMEOUT_S = 30.0  # the SDK's deadline per call: a call hanging longer is DEADLINE_EXCEEDED
SETTLE_S = 60.0  # every job final within this after the load ends
# Each job: 2 steps of 50 ms (the null model sleeps when asked).
REQUEST: dict[str, Any] = {
    "model": "null",
    "prompt": "frozen store",
    "num_inference_steps": 2,
    "extra": {"sleep_ms_per_step": 50},
}
# The job running when Redis stops: 5 steps of 200 ms, so it ends during the freeze.
LONG: dict[str, Any] = {**REQUEST, "num_inference_steps": 5, "extra": {"sleep_ms_per_step": 200}}
FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@pytest.fixture(scope="module")
def redis(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    yield server
    server.signal(signal.SIGCONT)  # never leave it stopped: it could not act on SIGTERM
    server.stop()


# Named as conftest's, so a failing test's report carries their logs.
@pytest.fixture(scope="module")
def controller(redis: RedisServer, log_dir: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--store", redis.url).start()  # the default --max-attempts 3
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    argv = ("--models", "null", "--slots", "4")
    daemon = Worker(log_dir, controller.address, "w-sigstop", model_dir, *argv).start()
    controller.wait_worker("w-sigstop")
    yield daemon
    daemon.stop()


class Load:
    """Threads that submit jobs with idempotency keys until `join`, and what each call got."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered: list[tuple[str, str]] = []  # (idempotency key, job id)
        self.refused: list[tuple[str, float, omnirt.errors.OmniRTError]] = []  # (key, call start, error)
        self.unexpected: list[str] = []  # anything but a typed OmniRT error
        self.threads: list[threading.Thread] = []

    def start(self, name: str, **client: int) -> None:
        """A thread submitting as `name`, through a client with these keywords (`retries`)."""
        thread = threading.Thread(target=self._run, args=(name, client), daemon=True)
        thread.start()
        self.threads.append(thread)

    def _run(self, name: str, settings: dict[str, int]) -> None:
        with self.controller.client(timeout=CALL_TIMEOUT_S, **settings) as client:
            i = 0
            while not self.stop.is_set():
                key = f"{name}-{i}-{uuid.uuid4().hex[:8]}"
                started = time.monotonic()
                try:
                    job = client.submit(**REQUEST, idempotency_key=key)
                except omnirt.errors.OmniRTError as exc:
                    with self.lock:
                        self.refused.append((key, started, exc))
                except Exception as exc:  # the test fails on any
                    with self.lock:
                        self.unexpected.append(f"{key}: {type(exc).__name__}: {exc}")
                else:
                    with self.lock:
                        self.answered.append((key, job.id))
                i += 1
                time.sleep(PACE_S)

    def join(self, timeout: float) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a submit call hung past its deadline"


@dataclass
class Outcome:
    """What the freeze left: the calls' answers, and every job once all were final."""

    load: Load
    answered_before: int  # calls answered before the freeze
    frozen_at: float  # monotonic
    thawed_at: float
    resent: dict[str, str]  # refused key -> the job its resend was answered
    jobs: list[omnirt.Job]


def settled(client: omnirt.Client) -> bool:
    return all(job.state in FINAL for job in client.list_jobs())


@pytest.fixture(scope="module")
def frozen(redis: RedisServer, controller: Controller, worker: Worker) -> Outcome:
    """Submit under load, freeze Redis for FREEZE_S, thaw it, resend every refused key, and
    wait (at most SETTLE_S) until no job is QUEUED or RUNNING."""
    load = Load(controller)
    load.start("retrying")  # the SDK's default retries
    load.start("plain-a", retries=0)
    load.start("plain-b", retries=0)
    time.sleep(BEFORE_S)
    with controller.client(timeout=CALL_TIMEOUT_S) as client:
        # A job that runs into the freeze: its result reaches the controller while Redis is
        # stopped, and must be stored once Redis is back (and the worker stream meets the freeze).
        long = client.submit(**LONG, idempotency_key=f"long-{uuid.uuid4().hex[:8]}")
        wait_for(lambda: client.get_job(long.id).state is JobState.RUNNING, 10, "the long job to run")
    with load.lock:
        load.answered.append((long.idempotency_key, long.id))
        before = len(load.answered)

    frozen_at = time.monotonic()
    redis.signal(signal.SIGSTOP)
    try:
        time.sleep(FREEZE_S)
    finally:
        redis.signal(signal.SIGCONT)
    thawed_at = time.monotonic()
    time.sleep(AFTER_S)
    load.join(CALL_TIMEOUT_S + 5)

    with controller.client(timeout=CALL_TIMEOUT_S) as client:
        # What a caller does with a refusal: send the same call again. It must find the job
        # the first send may have left (its script ran when Redis thawed), not make another.
        resent = {key: client.submit(**REQUEST, idempotency_key=key).id for key, _, _ in load.refused}
        wait_for(lambda: settled(client), SETTLE_S, "every job to reach a final state")
        jobs = client.list_jobs()
    return Outcome(load, before, frozen_at, thawed_at, resent, jobs)


def test_a_frozen_redis_loses_no_job_and_leaves_none_stuck(
    frozen: Outcome, controller: Controller, worker: Worker
) -> None:
    load = frozen.load
    assert frozen.answered_before > 0, "jobs were submitted before the freeze"
    assert load.unexpected == [], load.unexpected
    assert len(load.answered) > frozen.answered_before, "calls were answered after the thaw"

    # A refusal came from the freeze and said so: UNAVAILABLE naming the job store (or the
    # call's own deadline), never INTERNAL or UNKNOWN. Whether a `retries=0` caller meets one
    # depends on its connection (see above); the SDK's retries carry an idempotent call through.
    for key, started, error in load.refused:
        assert frozen.frozen_at - 1 <= started <= frozen.thawed_at, (
            f"{key} refused outside the freeze: {error}"
        )
        assert isinstance(error, omnirt.errors.Unavailable | omnirt.errors.DeadlineExceeded), (key, error)
        if isinstance(error, omnirt.errors.Unavailable):
            assert "the job store is unavailable" in error.message, (key, error)
    assert not any(key.startswith("retrying-") for key, _, _ in load.refused), load.refused

    # Every key a caller holds names exactly one job, the one it was answered (for a refused
    # key, the one its resend was answered), and that job succeeded; no job is stuck, and
    # there is no job no caller knows of.
    calls = load.answered + list(frozen.resent.items())
    by_key: dict[str, list[omnirt.Job]] = {}
    for job in frozen.jobs:
        by_key.setdefault(job.idempotency_key, []).append(job)
    for key, job_id in calls:
        assert [j.id for j in by_key.get(key, [])] == [job_id], f"{key}: one job, the one answered"
        assert by_key[key][0].state is JobState.SUCCEEDED, (key, by_key[key][0].error)
    assert set(by_key) == {key for key, _ in calls}, "only the callers' jobs"
    assert len(frozen.jobs) == len(calls)

    # Both daemons lived through it and serve a new job.
    assert controller.alive(), controller.log_tail()
    assert worker.alive(), worker.log_tail()
    with controller.client(timeout=CALL_TIMEOUT_S) as client:
        assert client.generate(**REQUEST).report.worker_id == "w-sigstop"

    # The controller said the store went away and came back, in that order (the health line
    # of controller/server.py, or upkeep.py's with the error; then upkeep.py's). The upkeep's
    # PING, once a second on a busy connection, gives up within ~11 s: inside the freeze.
    log = controller.log()
    gone = log.find("job store unreachable")
    assert gone >= 0, "a freeze longer than the store's timeouts is noticed"
    assert log.find("job store reachable again", gone) > gone, log[gone:][-3000:]


def test_a_frozen_redis_neither_loses_the_worker_nor_requeues_its_jobs(
    frozen: Outcome, controller: Controller
) -> None:
    """The worker's stream is read while Redis hangs (its events and results are stored beside
    it, controller/engines/redis/run_events.py and RedisEngine.worker_result): its heartbeats
    count, so the worker is not taken for lost and its jobs keep their attempts. Before, a
    12 s freeze dropped the worker or, after the thaw, its stale heartbeats gave up jobs it ran,
    and a 20 s one FAILED jobs on the default --max-attempts 3."""
    spurious = [
        line
        for line in controller.log().splitlines()
        if "worker lost" in line or "heartbeat leaves it out" in line or "was lost while running" in line
    ]
    assert spurious == [], spurious[:4]
    # One attempt more at most: a claim whose answer the controller never got (Redis ran the
    # command on the thaw) is requeued when its lease expires.
    assert [(j.id, j.attempts) for j in frozen.jobs if j.attempts > 2] == []
