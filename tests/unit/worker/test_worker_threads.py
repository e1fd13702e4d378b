"""A worker runs as many pipeline calls at once as it has slots, however few CPUs the machine has."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.daemon import WorkerDaemon
from omnirt.worker.executor import CancelFlags, EventSink, Executor
from omnirt.worker.protocol import Assignment, AssignmentItem, ItemOutcome

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
