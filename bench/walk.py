"""The hand-written files one `Generate` crosses, counted from the calls themselves.

    .venv/bin/python -m bench.walk              # tiny-sd on a legacy_call worker (docs/architecture.md)
    .venv/bin/python -m bench.walk --model null  # the control plane alone

A controller (memory engine) and a worker run in this process, on loopback, with the client in
a thread of its own; after one warm-up Generate (the model loads, caches fill), a profile hook on
every thread records each Python function called during a second `client.generate(...)`, and the
files they live in are listed: the SDK, the controller and the worker as written (generated
protobuf code, tests and third-party code are not counted; `omnirt._internal` is). Import time is
not counted: the walk is what one request runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import omnirt
from omnirt.testing import free_port

REPO = Path(__file__).resolve().parent.parent
ROOTS = tuple(str(REPO / folder) + "/" for folder in ("sdk", "controller", "worker", "cli"))
GENERATED = ("/v1/",)


class Calls:
    """The files of the functions called while `recording` (every thread, via the profile hook)."""

    def __init__(self) -> None:
        self.recording = False
        self.names: set[str] = set()
        self.functions: dict[str, set[str]] = {}

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.recording and event == "call":
            code = frame.f_code
            self.names.add(code.co_filename)
            self.functions.setdefault(code.co_filename, set()).add(code.co_qualname)

    @property
    def files(self) -> set[str]:
        """Ours, by their real paths (the editable install imports them through a link tree)."""
        real = {os.path.realpath(name) for name in self.names}
        return {name for name in real if name.startswith(ROOTS) and not any(g in name for g in GENERATED)}

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        threading.setprofile(self.hook)
        sys.setprofile(self.hook)
        try:
            yield
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def shown(path: str) -> str:
    """`path` as the docs name it (relative to the repository)."""
    return str(Path(path).relative_to(REPO))


async def walk(model: str, model_dir: Path) -> dict[str, list[str]]:
    from omnirt.controller.config import ControllerConfig
    from omnirt.controller.server import ControllerServer
    from omnirt.worker.config import WorkerConfig
    from omnirt.worker.daemon import WorkerDaemon

    port = free_port()
    address = f"127.0.0.1:{port}"
    calls = Calls()
    with calls.installed():
        # Heartbeats and leases far apart: the walk is what one request runs, not the upkeep.
        quiet = {"heartbeat_interval_ms": 60_000, "lease_timeout_ms": 180_000}
        server = ControllerServer(ControllerConfig(listen=address, **quiet))
        await server.start()
        worker = WorkerDaemon(
            WorkerConfig(controller=address, worker_id="w-walk", models=[model], model_dir=str(model_dir))
        )
        running = asyncio.create_task(worker.run())
        try:
            with omnirt.Client(address) as client:
                # The client blocks: it runs in a thread (the daemons run on this loop).
                while not [w for w in await asyncio.to_thread(client.list_workers) if w.id == "w-walk"]:
                    await asyncio.sleep(0.1)
                request = {"model": model, "prompt": "a red fox", "seed": 7}
                if model != "null":
                    request.update(width=64, height=64, num_inference_steps=2)
                await asyncio.to_thread(client.generate, **request)  # warm: loads, caches
                calls.recording = True
                await asyncio.to_thread(client.generate, **request)
                calls.recording = False
        finally:
            worker.request_drain("walk done")
            await running
            await server.stop()
    functions: dict[str, set[str]] = {}
    for name, called in calls.functions.items():
        real = os.path.realpath(name)
        if real in calls.files:
            functions.setdefault(shown(real), set()).update(called)
    return {name: sorted(functions[name]) for name in sorted(functions)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.walk", description=__doc__)
    parser.add_argument("--model", default="tiny-sd", help="tiny-sd (default) or null")
    parser.add_argument("--functions", action="store_true", help="also list the functions called per file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as models:
        files = asyncio.run(walk(args.model, Path(models)))
    for name, called in files.items():
        print(name)
        if args.functions:
            for function in called:
                print(f"    {function}")
    print(f"{len(files)} hand-written files cross one Generate of {args.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
