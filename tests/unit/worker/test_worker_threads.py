"""A worker runs as many pipeline calls at once as it has slots, however few CPUs the machine has."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from omnirt import types as t
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.daemon import WorkerDaemon
from omnirt.worker.modes.executor import CancelFlags, EventSink, Executor

# More slots than asyncio's default thread pool has threads on this machine.
SLOTS = min(32, (os.cpu_count() or 1) + 4) + 2


class BlockingCalls(Executor):
    """Each job is a blocking call in a thread, as a pipeline is; it returns once SLOTS run at once."""

    mode = "legacy_call"

    def __init__(self) -> None:
        self.all_running = threading.Barrier(SLOTS, timeout=20)

    @property
    def backend(self) -> str:
        return "cpu"

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        await asyncio.to_thread(self.all_running.wait)
        return [ItemOutcome(i.job_id, result=t.GenerateResult(job_id=i.job_id)) for i in assignment.items]


def test_every_slot_gets_a_thread(tmp_path: Path) -> None:
    # Port 1 on loopback refuses connections: results wait in the outbox, where the test reads them.
    config = WorkerConfig(
        controller="127.0.0.1:1",
        model_dir=str(tmp_path),
        worker_id="w-threads",
        slots=SLOTS,
        reconnect_max_s=0.2,
    )

    async def scenario() -> list[str]:
        daemon = WorkerDaemon(config, BlockingCalls())
        runner = asyncio.create_task(daemon.run())
        await asyncio.sleep(0.1)
        spec = t.ModelSpec(id="m", execution_mode="legacy_call")
        for i in range(SLOTS):
            daemon._handle(Assignment(f"a-{i}", spec, [AssignmentItem(f"job-{i}", t.GenerateRequest("m"))]))
        while daemon._outbox.durable_pending() < SLOTS:
            await asyncio.sleep(0.05)
        box = daemon._outbox
        outcomes = [(await box.get()).message.result for _ in range(box.durable_pending())]
        daemon.request_drain("test")
        await asyncio.wait_for(runner, 10)
        return [o.WhichOneof("outcome") for o in outcomes]

    assert asyncio.run(scenario()) == ["result"] * SLOTS


class FailingWithPaths(Executor):
    """A mode whose errors name the worker's folders, as a persistent rank's traceback text does."""

    mode = "legacy_call"

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir

    @property
    def backend(self) -> str:
        return "cpu"

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        if assignment.assignment_id == "a-raises":
            raise FileNotFoundError(f"{self.model_dir}/sd/unet/config.json")
        error = t.JobError(
            "INTERNAL", f"rank 1: cannot open /srv/secret/weights.bin (model {assignment.model.source})"
        )
        return [ItemOutcome(i.job_id, error=error) for i in assignment.items]


def test_no_error_a_client_sees_names_a_folder_of_the_worker(tmp_path: Path) -> None:
    config = WorkerConfig(controller="127.0.0.1:1", model_dir=str(tmp_path), worker_id="w-paths", slots=2)

    async def scenario() -> list[str]:
        daemon = WorkerDaemon(config, FailingWithPaths(tmp_path))
        runner = asyncio.create_task(daemon.run())
        spec = t.ModelSpec(id="m", execution_mode="legacy_call", source="/catalog/says/m")
        for name in ("a-raises", "a-returns"):
            daemon._handle(Assignment(name, spec, [AssignmentItem(f"job-{name}", t.GenerateRequest("m"))]))
        while daemon._outbox.durable_pending() < 2:
            await asyncio.sleep(0.05)
        box = daemon._outbox
        messages = sorted([(await box.get()).message.result.error.message for _ in range(2)])
        daemon.request_drain("test")
        await asyncio.wait_for(runner, 10)
        return messages

    returned, raised = asyncio.run(scenario())  # sorted: "rank 1: ..." before "worker error: ..."
    assert str(tmp_path) not in raised and raised.endswith("FileNotFoundError: MODEL_DIR/sd/unet/config.json")
    # Other folders keep their last part only; the catalog's own source is no secret.
    assert returned == "rank 1: cannot open .../weights.bin (model /catalog/says/m)"


class CountingCalls(Executor):
    """Each job succeeds at once; counts the pipeline calls."""

    mode = "legacy_call"

    def __init__(self) -> None:
        self.calls = 0

    @property
    def backend(self) -> str:
        return "cpu"

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        self.calls += 1
        return [ItemOutcome(i.job_id, result=t.GenerateResult(job_id=i.job_id)) for i in assignment.items]


def test_a_job_offered_again_while_its_result_waits_to_be_sent_is_not_run_twice(tmp_path: Path) -> None:
    # The controller is down (port 1): the result of a-1 waits in the outbox, as after a crash
    # of the controller that assigned it; a restarted one offers the job again as a-2.
    config = WorkerConfig(controller="127.0.0.1:1", model_dir=str(tmp_path), worker_id="w-again", slots=2)
    calls = CountingCalls()

    async def scenario() -> list[tuple[str, str]]:
        daemon = WorkerDaemon(config, calls)
        runner = asyncio.create_task(daemon.run())
        spec = t.ModelSpec(id="m", execution_mode="legacy_call")
        daemon._handle(Assignment("a-1", spec, [AssignmentItem("job-1", t.GenerateRequest("m"))]))
        while daemon._outbox.durable_pending() < 1:
            await asyncio.sleep(0.02)
        daemon._handle(Assignment("a-2", spec, [AssignmentItem("job-1", t.GenerateRequest("m"))]))
        await asyncio.sleep(0.2)  # a second run, if one were started, would have finished
        box = daemon._outbox
        results = [(await box.get()).message.result for _ in range(box.durable_pending())]
        daemon.request_drain("test")
        await asyncio.wait_for(runner, 10)
        return [(r.job_id, r.assignment_id) for r in results]

    assert asyncio.run(scenario()) == [("job-1", "a-2")]
    assert calls.calls == 1
