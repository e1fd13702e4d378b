"""The controller as a scheduler: priorities, the queue bound, deadlines, cancels, routing, worker loss.

Real `omnirt-controller` and `omnirt-worker` processes on loopback, driven through `omnirt.Client`.
Slow jobs are tiny-sd at 256x256 with many steps (about 30 ms a step here, several seconds in all);
tests wait on job events, never on fixed sleeps.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

import omnirt
from omnirt import errors
from omnirt.types import EventKind, Job, JobEvent, JobState, WorkerInfo, WorkerState
from tests.conftest import UNSERVED_SD
from tests.daemons import Controller, Worker, job_store, wait_for

SCHEDULER_CATALOG = (
    UNSERVED_SD
    + """
# The same tiny pipeline under other ids, so a test can give a model to one worker only.
[[models]]
id = "tiny-sd-b"
tasks = ["text2image"]
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 4

[[models]]
id = "tiny-sd-d"
tasks = ["text2image"]
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 4
"""
)

# A job that runs for seconds: 100 steps at 256x256 (the model's step limit is 100; about 30 ms a step
# on an idle core of this machine, longer under load).
SLOW = {"model": "tiny-sd", "width": 256, "height": 256, "num_inference_steps": 100}
SLOW_STEPS = 100


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["memory", "redis"])
def store_args(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[tuple[str, ...]]:
    """Every test of this module runs on both job stores (a real redis-server for the second)."""
    with job_store(request.param, log_dir) as flags:
        yield flags


@pytest.fixture(scope="module")
def user_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Overrides conftest's catalog; conftest's `controller` fixture loads this one."""
    path = tmp_path_factory.mktemp("catalog") / "scheduler.toml"
    path.write_text(SCHEDULER_CATALOG)
    return path


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    """One slot, tiny-sd only (conftest's worker serves every legacy model, we need some unserved)."""
    daemon = Worker(log_dir, controller.address, "w-main", model_dir, "--models", "tiny-sd", "--slots", "1")
    daemon.start()
    controller.wait_worker("w-main")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address, timeout=30) as c:
        # Load the model once, so every later run is all steps.
        c.generate(model="tiny-sd", prompt="warm up", num_inference_steps=2, timeout=120)
        yield c


class Cluster:
    """A controller of its own and named workers that a test can start, kill or stop."""

    def __init__(self, log_dir: Path, model_dir: Path, catalog: Path, store_args: tuple[str, ...]) -> None:
        self.log_dir, self.model_dir = log_dir, model_dir
        # Its own Redis database: controllers on one store share their queue and their workers.
        own_store = tuple(a.replace("/0", "/2") for a in store_args)
        self.controller = Controller(log_dir, "--catalog", str(catalog), *own_store).start()
        self.workers: dict[str, Worker] = {}
        self.client = omnirt.Client(self.controller.address, timeout=30)

    def start(self, *specs: tuple[str, list[str]]) -> None:
        """Start the named workers (all at once) unless they run already; wait until connected."""
        for worker_id, args in specs:
            old = self.workers.get(worker_id)
            if old is None or not old.alive():
                daemon = Worker(self.log_dir, self.controller.address, worker_id, self.model_dir, *args)
                self.workers[worker_id] = daemon.start()
        for worker_id, _ in specs:
            self.controller.wait_worker(worker_id)

    def info(self, worker_id: str) -> WorkerInfo | None:
        return next((w for w in self.client.list_workers() if w.id == worker_id), None)

    def close(self) -> None:
        self.client.close()
        for daemon in self.workers.values():
            daemon.stop()
        self.controller.stop()

    def logs(self) -> str:
        parts = [self.controller, *self.workers.values()]
        return "\n".join(f"--- {d.name}\n{d.log()[-3000:]}" for d in parts)


# Events at once (not every 0.25 s): tests act on a job mid-run once its first PROGRESS arrives.
WARM = ("w-warm", ["--models", "tiny-sd", "--slots", "1", "--progress-interval-ms", "0"])
ONLY_B = ("w-b", ["--models", "tiny-sd-b", "--slots", "2"])
# Sorts before w-warm: with equal load the router's last tie-break (the id) would pick it.
COLD = ("w-cold", ["--models", "tiny-sd", "--slots", "1", "--progress-interval-ms", "0"])


@pytest.fixture(scope="module")
def cluster(
    log_dir: Path, model_dir: Path, user_catalog: Path, store_args: tuple[str, ...]
) -> Iterator[Cluster]:
    c = Cluster(log_dir, model_dir, user_catalog, store_args)
    try:
        c.start(WARM, ONLY_B)
        yield c
    finally:
        c.close()


# ---- helpers ----------------------------------------------------------------------------------


def tag() -> str:
    return uuid.uuid4().hex[:8]


def wait_event(
    client: omnirt.Client, job_id: str, pred: Callable[[JobEvent], bool], timeout: float = 60
) -> JobEvent:
    """The first event of the job that matches (the stream replays the log from the start)."""
    for event in client.watch(job_id, timeout=timeout):
        if pred(event):
            return event
    raise AssertionError(f"job {job_id} ended without the awaited event: {client.get_job(job_id)}")


def progress_at_least(step: int) -> Callable[[JobEvent], bool]:
    return lambda e: e.kind is EventKind.PROGRESS and e.progress is not None and e.progress.step >= step


def all_events(client: omnirt.Client, job_id: str, timeout: float = 60) -> list[JobEvent]:
    """The job's whole event log; returns once the job is final (the stream ends after it)."""
    return list(client.watch(job_id, timeout=timeout))


def states(events: list[JobEvent]) -> list[JobState]:
    return [e.state for e in events if e.kind is EventKind.STATE and e.state is not None]


def count(events: list[JobEvent], kind: EventKind) -> int:
    return sum(1 for e in events if e.kind is kind)


def worker_info(client: omnirt.Client, worker_id: str) -> WorkerInfo | None:
    return next((w for w in client.list_workers() if w.id == worker_id), None)


def seconds_until_idle(client: omnirt.Client, worker_id: str, timeout: float = 60) -> float:
    """How long until the controller sees no job on the worker (the slot frees on its result)."""
    started = time.monotonic()
    wait_for(lambda: (w := worker_info(client, worker_id)) is not None and w.busy_slots == 0, timeout, "idle")
    return time.monotonic() - started


def jobs_with_label(client: omnirt.Client, key: str, value: str) -> list[Job]:
    return [j for j in client.list_jobs() if j.labels.get(key) == value]


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """Most intervals open at once; one that ends when another starts does not overlap it."""
    points = sorted(
        [(s, 1) for s, _ in intervals] + [(f, -1) for _, f in intervals], key=lambda p: (p[0], p[1])
    )
    most = now = 0
    for _, delta in points:
        now += delta
        most = max(most, now)
    return most


# ---- 1. priorities ----------------------------------------------------------------------------


def test_higher_priority_runs_first_and_fifo_within_a_priority(client: omnirt.Client) -> None:
    seconds_until_idle(client, "w-main")
    blocker = client.submit(prompt="blocker", **SLOW)
    wait_event(client, blocker.id, progress_at_least(1))
    # Interleaved low (10) and high (90) jobs; distinct step counts so no two could share a batch,
    # and distinct sizes so none joins another's step batch beside the slot (test_step_rows.py).
    order = [("low-1", 10), ("high-1", 90), ("low-2", 10), ("high-2", 90), ("low-3", 10), ("high-3", 90)]
    jobs = {
        name: client.submit(
            model="tiny-sd", prompt=name, priority=prio, num_inference_steps=2 + i, width=64 + 8 * i
        )
        for i, (name, prio) in enumerate(order)
    }
    assert client.get_job(blocker.id).state is JobState.RUNNING, (
        "the blocker ended before the backlog was built"
    )
    expected = ["high-1", "high-2", "high-3", "low-1", "low-2", "low-3"]
    queued = {name: client.get_job(job.id) for name, job in jobs.items()}
    assert all(j.state is JobState.QUEUED for j in queued.values()), queued
    assert [queued[name].queue_position for name in expected] == list(range(6))
    assert "waiting for a free slot" in queued["low-3"].waiting_reason

    client.cancel(blocker.id)  # no need to wait for the rest of it
    done = {name: (client.wait(job.id, timeout=60), client.get_job(job.id)) for name, job in jobs.items()}
    assert all(job.started_at is not None for _, job in done.values())
    started = sorted(done, key=lambda name: done[name][1].started_at)  # type: ignore[arg-type,return-value]
    assert started == expected, {n: j.started_at for n, (_, j) in done.items()}
    assert all(result.report.worker_id == "w-main" for result, _ in done.values())


def test_a_batch_takes_higher_priority_companions_before_lower_ones(client: omnirt.Client) -> None:
    """tiny-sd batches up to 8 compatible jobs per call: the 2 high ones must not wait behind 7 low ones."""
    seconds_until_idle(client, "w-main")
    blocker = client.submit(prompt="blocker", **SLOW)
    wait_event(client, blocker.id, progress_at_least(1))
    same = {"model": "tiny-sd", "num_inference_steps": 3}  # one batch key for all ten
    lows = [client.submit(prompt=f"low {i}", priority=10, **same) for i in range(8)]
    highs = [client.submit(prompt=f"high {i}", priority=90, **same) for i in range(2)]
    assert client.get_job(blocker.id).state is JobState.RUNNING, (
        "the blocker ended before the backlog was built"
    )
    assert [client.get_job(j.id).queue_position for j in highs] == [0, 1]
    client.cancel(blocker.id)
    for job in lows + highs:
        client.wait(job.id, timeout=60)
    started = {j.id: client.get_job(j.id).started_at for j in lows + highs}
    assert all(started.values())
    last_high = max(started[j.id] for j in highs)  # type: ignore[type-var]
    first_low = min(started[j.id] for j in lows)  # type: ignore[type-var]
    assert last_high <= first_low, {"highs": [started[j.id] for j in highs], "first low": first_low}


# ---- 2. the queue bound ------------------------------------------------------------------------


def test_a_full_queue_answers_resource_exhausted_and_drops_nothing(
    log_dir: Path, user_catalog: Path, store_args: tuple[str, ...]
) -> None:
    # A store of its own (Redis database 1): the bound counts every job in the store.
    own_store = tuple(a.replace("/0", "/1") for a in store_args)
    bounded = Controller(log_dir, "--catalog", str(user_catalog), "--max-queue", "3", *own_store).start()
    try:
        with omnirt.Client(bounded.address, timeout=10) as client:
            first = [
                client.submit(model="unserved-sd", prompt=f"wait {i}", idempotency_key=f"q-{i}")
                for i in range(3)
            ]
            for call in (client.submit, client.generate):
                with pytest.raises(errors.QueueFull) as info:
                    call(model="unserved-sd", prompt="one too many")
                assert info.value.retry_after_s is not None and info.value.retry_after_s > 0
            # A retry of an accepted submission is still answered with its job, full queue or not.
            again = client.submit(model="unserved-sd", prompt="wait 0", idempotency_key="q-0")
            assert again.id == first[0].id

            jobs = client.list_jobs()
            assert {j.id for j in jobs} == {j.id for j in first}, "a refused request must not create a job"
            assert all(j.state is JobState.QUEUED for j in jobs)
            assert [client.get_job(j.id).queue_position for j in first] == [0, 1, 2]

            assert client.cancel(first[1].id).cancelled is True
            fourth = client.submit(model="unserved-sd", prompt="room again")
            assert fourth.state is JobState.QUEUED
            with pytest.raises(errors.QueueFull):
                client.submit(model="unserved-sd", prompt="full again")
            assert {j.id for j in client.list_jobs(states=[JobState.QUEUED])} == {
                first[0].id,
                first[2].id,
                fourth.id,
            }
    finally:
        bounded.stop()


# ---- 3. deadlines ------------------------------------------------------------------------------


def test_a_deadline_that_passes_mid_denoise_fails_the_job_and_frees_the_worker(client: omnirt.Client) -> None:
    seconds_until_idle(client, "w-main")
    job = client.submit(prompt="too slow for its deadline", timeout_ms=1000, **SLOW)
    events = all_events(client, job.id)
    final = client.get_job(job.id)
    assert final.state is JobState.FAILED
    assert final.error is not None and final.error.code == "DEADLINE_EXCEEDED", final.error
    assert "while running" in final.error.message
    assert states(events) == [JobState.QUEUED, JobState.RUNNING, JobState.FAILED]
    assert 1 <= count(events, EventKind.PROGRESS) < SLOW_STEPS, "it was running, and did not run to the end"
    assert count(events, EventKind.RESULT) == 0
    with pytest.raises(errors.DeadlineExceeded):
        client.wait(job.id, timeout=10)
    # The worker stopped at its next step: the slot frees well before the remaining steps would end.
    assert seconds_until_idle(client, "w-main") < 1.5
    assert client.generate(model="tiny-sd", prompt="next", seed=1, timeout=60).report.worker_id == "w-main"


# ---- 4. cancel while running ------------------------------------------------------------------


def test_cancelling_a_running_job_stops_the_worker_at_its_next_step(client: omnirt.Client) -> None:
    seconds_until_idle(client, "w-main")
    job = client.submit(prompt="cancel me", **SLOW)
    wait_event(client, job.id, progress_at_least(2))
    outcome = client.cancel(job.id)
    assert outcome.cancelled is True and outcome.state is JobState.CANCELLED
    assert outcome.error is not None and outcome.error.code == "CANCELLED"

    freed_after = seconds_until_idle(client, "w-main")
    events = all_events(client, job.id)
    assert states(events) == [JobState.QUEUED, JobState.RUNNING, JobState.CANCELLED]
    assert count(events, EventKind.PROGRESS) < SLOW_STEPS // 4
    assert count(events, EventKind.RESULT) == 0
    # ~97 steps were left (about 3 s); the worker confirms the stop within about a step.
    assert freed_after < 1.5, f"slot freed {freed_after:.2f} s after the cancel"

    nxt = client.generate(model="tiny-sd", prompt="after the cancel", seed=2, timeout=60)
    assert nxt.report.worker_id == "w-main" and nxt.artifacts

    before = client.get_job(job.id)
    again = client.cancel(job.id)
    assert again.cancelled is False and again.state is JobState.CANCELLED
    assert again.finished_at == before.finished_at
    with pytest.raises(errors.Cancelled):
        client.wait(job.id, timeout=10)


# ---- 5. a Generate client that goes away --------------------------------------------------------


def test_generate_whose_grpc_deadline_passes_does_not_leave_its_job_running(client: omnirt.Client) -> None:
    seconds_until_idle(client, "w-main")
    label = tag()
    with pytest.raises(errors.DeadlineExceeded):
        client.generate(prompt="gives up after 1 s", labels={"t": label}, timeout=1, **SLOW)
    (job,) = jobs_with_label(client, "t", label)
    events = all_events(client, job.id)
    final = client.get_job(job.id)
    # docs/controller.md: the gRPC deadline is the job's deadline, so the job expires (a client that
    # disconnects before its deadline cancels instead: see the next test).
    assert final.state is JobState.FAILED, final
    assert final.error is not None and final.error.code == "DEADLINE_EXCEEDED", final.error
    assert JobState.RUNNING in states(events) and count(events, EventKind.RESULT) == 0
    assert seconds_until_idle(client, "w-main") < 1.5
    assert client.generate(model="tiny-sd", prompt="next", seed=3, timeout=60).report.worker_id == "w-main"


CLIENT_SCRIPT = """
import sys, omnirt
omnirt.Client(sys.argv[1]).generate(
    model="tiny-sd", prompt="abandoned", width=256, height=256, num_inference_steps=100,
    labels={"t": sys.argv[2]}, timeout=120,
)
"""


def test_a_client_that_disconnects_from_generate_cancels_its_job(
    client: omnirt.Client, controller: Controller
) -> None:
    seconds_until_idle(client, "w-main")
    label = tag()
    proc = subprocess.Popen([sys.executable, "-c", CLIENT_SCRIPT, controller.address, label])
    try:
        wait_for(lambda: len(jobs_with_label(client, "t", label)) == 1, 60, "the client's job")
        (job,) = jobs_with_label(client, "t", label)
        wait_event(client, job.id, progress_at_least(1))
        proc.kill()  # the connection closes with the call in flight
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    events = all_events(client, job.id, timeout=30)
    final = client.get_job(job.id)
    assert final.state is JobState.CANCELLED, final
    assert final.error is not None and final.error.code == "CANCELLED"
    assert count(events, EventKind.RESULT) == 0
    assert seconds_until_idle(client, "w-main") < 5
    assert client.generate(model="tiny-sd", prompt="next", seed=4, timeout=60).artifacts


# ---- 6. idempotency ---------------------------------------------------------------------------


def test_an_idempotency_key_gives_one_job_per_request(client: omnirt.Client) -> None:
    key = "k-" + tag()
    request = {"model": "tiny-sd", "prompt": "once only", "num_inference_steps": 2, "idempotency_key": key}
    first = client.submit(**request)
    second = client.submit(**request, timeout_ms=60_000)  # deadlines are not part of "the same request"
    assert second.id == first.id
    assert [j.id for j in client.list_jobs() if j.idempotency_key == key] == [first.id]

    with pytest.raises(errors.InvalidRequest) as info:
        client.submit(**{**request, "prompt": "another prompt"})
    assert info.value.field == "idempotency_key" and first.id in str(info.value)

    client.wait(first.id, timeout=60)
    after = client.submit(**request)  # the key lives as long as its job: nothing runs again
    assert after.id == first.id and after.state is JobState.SUCCEEDED
    assert [j.id for j in client.list_jobs() if j.idempotency_key == key] == [first.id]
    assert client.get_job(first.id).attempts == 1


# ---- 10. bad scheduler input -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"priority": -1}, "priority"),
        ({"priority": 101}, "priority"),
        ({"deadline_ms": "past"}, "deadline_ms"),
        ({"timeout_ms": -5}, "timeout_ms"),
    ],
)
def test_bad_scheduling_fields_are_refused_and_create_nothing(
    client: omnirt.Client, fields: dict[str, object], field: str
) -> None:
    before = len(client.list_jobs())
    if fields.get("deadline_ms") == "past":
        fields = {"deadline_ms": int(time.time() * 1000) - 60_000}
    for call in (client.submit, client.generate, client.validate):
        with pytest.raises(errors.InvalidRequest) as info:
            call(model="tiny-sd", prompt="x", **fields)
        assert info.value.field == field, info.value
    assert len(client.list_jobs()) == before


def test_unknown_ids_are_not_found_and_create_nothing(client: omnirt.Client) -> None:
    before = len(client.list_jobs())
    for call in (client.get_job, client.cancel):
        with pytest.raises(errors.JobNotFound):
            call("job-0000000000000000")
    with pytest.raises(errors.JobNotFound):
        list(client.watch("job-0000000000000000"))
    with pytest.raises(errors.WorkerNotFound):
        client.drain_worker("w-nobody")
    assert len(client.list_jobs()) == before


# ---- 9. drain through the API -------------------------------------------------------------------


def test_drain_worker_finishes_its_job_takes_nothing_new_and_exits(
    client: omnirt.Client, controller: Controller, log_dir: Path, model_dir: Path
) -> None:
    args = ("--models", "tiny-sd-d", "--progress-interval-ms", "0")
    drained = Worker(log_dir, controller.address, "w-drain", model_dir, *args).start()
    try:
        controller.wait_worker("w-drain")
        job = client.submit(model="tiny-sd-d", prompt="finish me", num_inference_steps=60)
        wait_event(client, job.id, progress_at_least(1), timeout=120)
        info = client.drain_worker("w-drain")
        assert info.id == "w-drain" and info.state is WorkerState.DRAINING
        later = client.submit(model="tiny-sd-d", prompt="must wait", num_inference_steps=2)
        while drained.alive():
            seen = client.get_job(later.id)
            if drained.alive():  # still there after the read: the job must not have gone to it
                assert seen.state is JobState.QUEUED, seen
            time.sleep(0.05)
        assert drained.wait(60) == 0, "a drained worker exits 0"
        assert client.get_job(job.id).state is JobState.SUCCEEDED
        assert client.wait(job.id, timeout=10).report.worker_id == "w-drain"
        controller.wait_worker("w-drain", present=False, timeout=15)
        still = client.get_job(later.id)
        assert (
            still.state is JobState.QUEUED
            and "no connected worker serves model tiny-sd-d" in still.waiting_reason
        )
        client.cancel(later.id)
    finally:
        drained.stop()


# ---- 7. routing across workers ------------------------------------------------------------------


def test_jobs_run_only_on_workers_that_serve_their_model_within_slots(cluster: Cluster) -> None:
    client = cluster.client
    serving = {"tiny-sd": {"w-warm", "w-cold"}, "tiny-sd-b": {"w-b"}}
    slots = {"w-warm": 1, "w-cold": 1, "w-b": 2}
    # Distinct sizes: each job its own call, none joining another's step batch beside the slots.
    jobs = [
        client.submit(model=model, prompt=f"{model} {i}", num_inference_steps=10, width=64 + 8 * i)
        for i in range(4)
        for model in ("tiny-sd", "tiny-sd-b")
    ]
    model_of = {j.id: j.model for j in jobs}
    most_busy: dict[str, int] = {}
    while any(client.get_job(j.id).state in (JobState.QUEUED, JobState.RUNNING) for j in jobs):
        for w in client.list_workers():
            assert w.busy_slots <= w.slots, w
            most_busy[w.id] = max(most_busy.get(w.id, 0), w.busy_slots)
            for job_id in w.running_job_ids:
                if job_id in model_of:
                    assert w.id in serving[model_of[job_id]], (job_id, model_of[job_id], w.id)
        time.sleep(0.02)
    finished = [client.get_job(j.id) for j in jobs]
    failed = [(j.id, j.model, j.state.value, j.error) for j in finished if j.state is not JobState.SUCCEEDED]
    assert not failed, failed
    # Reconstruct the pipeline calls (a batch of compatible jobs is one call and takes one slot).
    calls: dict[tuple[str, str], list[datetime]] = {}
    for job in finished:
        report = client.wait(job.id, timeout=10).report
        assert report.worker_id == job.worker_id and report.worker_id in serving[job.model], job
        assert job.started_at and job.finished_at
        call = calls.setdefault((job.worker_id, report.batch_group_id or job.id), [])
        call += [job.started_at, job.finished_at]
    by_worker: dict[str, list[tuple[datetime, datetime]]] = {}
    for (worker_id, _), times in calls.items():
        by_worker.setdefault(worker_id, []).append((min(times), max(times)))
    overlaps = {w: max_overlap(iv) for w, iv in by_worker.items()}
    assert all(overlaps[w] <= slots[w] for w in overlaps), (overlaps, by_worker)
    assert overlaps["w-b"] == 2, "a 2-slot worker with a backlog runs two calls at once"
    assert most_busy.get("w-b", 0) <= 2 and most_busy.get("w-warm", 0) <= 1


def test_a_job_goes_to_the_worker_that_has_its_model_loaded(cluster: Cluster) -> None:
    client = cluster.client
    cold = cluster.workers.get("w-cold")
    if cold is not None and cold.alive():  # left over from another test: make it cold again
        cold.stop()
        cluster.controller.wait_worker("w-cold", present=False)
    cluster.start(WARM)
    assert client.generate(
        model="tiny-sd", prompt="warm it", num_inference_steps=2, timeout=120
    ).report.worker_id == ("w-warm")
    cluster.start(COLD)
    wait_for(
        lambda: "tiny-sd" in (cluster.info("w-warm") or WorkerInfo("")).loaded_models,
        10,
        "w-warm to report tiny-sd loaded",
    )
    listed = {w.id: w for w in client.list_workers()}
    assert "tiny-sd" not in listed["w-cold"].loaded_models and listed["w-cold"].busy_slots == 0
    for i in range(2):
        report = client.generate(
            model="tiny-sd", prompt=f"prefer warm {i}", num_inference_steps=2, timeout=60
        ).report
        assert report.worker_id == "w-warm" and report.cold_start is False, report


# ---- 8. a worker killed mid-job -----------------------------------------------------------------


def test_a_job_whose_worker_is_killed_completes_on_another_once(cluster: Cluster) -> None:
    client = cluster.client
    cluster.start(WARM, COLD)
    job = client.submit(model="tiny-sd", prompt="survives a kill", num_inference_steps=100)
    running = wait_event(client, job.id, lambda e: e.kind is EventKind.STATE and e.state is JobState.RUNNING)
    wait_event(client, job.id, progress_at_least(1))
    victim = running.worker_id
    other = ({"w-warm", "w-cold"} - {victim}).pop()
    cluster.workers[victim].signal(signal.SIGKILL)
    cluster.workers[victim].wait(10)

    result = client.wait(job.id, timeout=120)
    events = all_events(client, job.id)
    final = client.get_job(job.id)
    assert result.report.worker_id == other, cluster.logs()
    assert final.attempts == 2 and final.worker_id == other
    assert states(events) == [
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
    ], [(e.kind, e.state, e.worker_id) for e in events if e.kind is EventKind.STATE]
    requeued = [e for e in events if e.kind is EventKind.STATE and e.state is JobState.QUEUED][1]
    assert (
        requeued.error is not None
        and requeued.error.code == "UNAVAILABLE"
        and victim in requeued.error.message
    )
    runs = [
        (e.worker_id, e.attempt) for e in events if e.kind is EventKind.STATE and e.state is JobState.RUNNING
    ]
    assert runs == [(victim, 1), (other, 2)]
    assert count(events, EventKind.RESULT) == 1
    cluster.controller.wait_worker(victim, present=False, timeout=15)
