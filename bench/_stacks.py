"""OmniRT deployments the scenarios start: a controller and its workers, as real processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from ._daemons import Controller, Daemon, Worker, free_port, wait_for
from ._scenario import Context


@dataclass
class Stack:
    """One controller, its workers, and the HTTP gateway's base URL when it has one."""

    controller: Controller
    workers: list[Worker] = field(default_factory=list)
    http_url: str = ""

    @property
    def address(self) -> str:
        return self.controller.address

    @property
    def daemons(self) -> list[Daemon]:
        return [*self.workers, self.controller]

    def pids(self) -> dict[str, int]:
        return {"controller": self.controller.pid, **{w.name: w.pid for w in self.workers}}

    def stop(self) -> None:
        stop_all(self.daemons)


def stop_all(daemons: Iterable[Daemon]) -> None:
    """Stop daemons, workers first; one that fails to stop does not keep the others running."""
    for daemon in daemons:
        with contextlib.suppress(Exception):
            daemon.stop()


def start_stack(
    ctx: Context,
    name: str,
    worker_args: list[list[str]],
    controller_args: tuple[str, ...] = (),
    http: bool = False,
) -> Stack:
    """A controller (with `controller_args`, and an HTTP gateway if asked) and one worker per args list.

    Workers get the context's torch threads and model folder; returns once all are connected.
    """
    extra = list(controller_args)
    http_url = ""
    if http:
        port = free_port()
        extra += ["--http", f"127.0.0.1:{port}"]
        http_url = f"http://127.0.0.1:{port}"
    controller = Controller(ctx.log_dir, *extra).start()
    stack = Stack(controller, http_url=http_url)
    try:
        for i, args in enumerate(worker_args):
            threads = ("--torch-threads", str(ctx.torch_threads))
            worker = Worker(ctx.log_dir, controller.address, f"{name}-w{i}", ctx.model_dir, *threads, *args)
            stack.workers.append(worker.start())
        wait_connected(controller, stack.workers)
    except BaseException:
        stack.stop()
        raise
    return stack


def wait_connected(controller: Controller, workers: list[Worker], timeout: float = 180) -> None:
    """Wait until the controller lists every worker; fail at once, with its log, if one exits."""

    def connected() -> bool:
        for worker in workers:
            if not worker.alive():
                raise RuntimeError(f"{worker.name} exited before connecting:\n{worker.log_tail(3000)}")
        return {w.worker_id for w in workers} <= controller.worker_ids()

    wait_for(connected, timeout, f"workers {[w.worker_id for w in workers]} to connect")


def tiny_sd_stacks(ctx: Context, models: str = "tiny-sd") -> dict[str, Stack]:
    """Two tiny-sd deployments side by side: batching `off` (`--max-batch-size 1`) and `on` (8).

    Each is one controller and one worker with one slot: one pipeline call at a time, so
    batching is the only way to run several requests at once.
    """
    stacks: dict[str, Stack] = {}
    try:
        for mode, size in (("off", "1"), ("on", "8")):
            stacks[mode] = start_stack(
                ctx, f"sd-batch-{mode}", [["--models", models, "--slots", "1"]], ("--max-batch-size", size)
            )
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    return stacks
