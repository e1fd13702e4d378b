"""Ray Serve as a peer: its own virtualenv (bench/ray/setup.sh), run as a separate process tree.

`bench/ray/serve_app.py` runs under `.venv-bench-ray/bin/python` (or `$OMNIRT_BENCH_RAY_PYTHON`,
or the `bin/python` of `$OMNIRT_BENCH_RAY_VENV`, the folder setup.sh installs into) in a session
of its own, so that stopping it can reach every process Ray started (GCS, raylet, actors), by
the session id, which is the pid this module started.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._daemons import free_port
from ._http import post_json, session
from ._machine import ROOT

APP = ROOT / "bench" / "ray" / "serve_app.py"
SETUP = "bash bench/ray/setup.sh"


def ray_python() -> Path | None:
    """The Ray virtualenv's interpreter, or None when it is not installed."""
    configured = os.environ.get("OMNIRT_BENCH_RAY_PYTHON")
    # The same variable as setup.sh's, so that a virtualenv made elsewhere is found (and one
    # pointed at a missing folder reads as Ray not installed); relative to the repository, as there.
    venv = ROOT / (os.environ.get("OMNIRT_BENCH_RAY_VENV") or ".venv-bench-ray")
    path = Path(configured) if configured else venv / "bin" / "python"
    return path if path.exists() else None


def _session_pids(sid: int) -> list[int]:
    """Pids of the processes in session `sid` (read from /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session (fields 3-6, 1-based).
        if int(fields[3]) == sid:
            pids.append(int(entry.name))
    return pids


class RayServe:
    """The Ray Serve app on a free loopback port; `url` is its HTTP proxy."""

    def __init__(
        self,
        python: Path,
        log_dir: Path,
        model_dir: Path,
        torch_threads: int,
        max_batch_size: int,
        noop_batch_wait_s: float = 0.0,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / "ray-serve.log"
        self.temp_dir = tempfile.mkdtemp(prefix="omnirt-ray-")
        self.argv = [
            str(python),
            str(APP),
            "--port",
            str(self.port),
            "--model-dir",
            str(model_dir),
            "--torch-threads",
            str(torch_threads),
            "--max-batch-size",
            str(max_batch_size),
            "--noop-batch-wait-s",
            str(noop_batch_wait_s),
            # Ray's own session folder, removed on stop: nothing left in /tmp/ray afterwards. Short,
            # because Ray puts Unix sockets in it (their paths are limited to 107 bytes).
            "--temp-dir",
            self.temp_dir,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.launched = 0.0
        self.ready_s = 0.0
        self.version = ""

    def start(self, timeout: float = 300) -> RayServe:
        """Start it and wait until every application answers (its READY line)."""
        return self.launch().wait_ready(timeout)

    def launch(self) -> RayServe:
        """Start its process and return at once (other daemons may start meanwhile)."""
        self.launched = time.perf_counter()
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        return self

    def wait_ready(self, timeout: float = 300) -> RayServe:
        """Wait, up to `timeout` s after the launch, until its READY line; stop it on a timeout."""
        assert self.proc is not None, "launch() first"
        started = self.launched
        while time.perf_counter() - started < timeout:
            ready = re.search(r"^READY ray (\S+)", self.log(), re.MULTILINE)
            if ready:
                self.ready_s = round(time.perf_counter() - started, 1)
                self.version = ready.group(1)
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"Ray Serve exited with status {self.proc.returncode}:\n{self.log()[-3000:]}"
                )
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"Ray Serve not ready after {timeout:.0f} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (Ray shuts its cluster down), then SIGKILL whatever is left of its session."""
        if self.proc is None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            return
        sid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        deadline = time.monotonic() + 10
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in _session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


# For a scenario that runs Ray beside OmniRT and goes on without it (`continuous`): Ray's part
# of its result is a dict with its status (ok, off, skipped, failed) and why.


def launch(
    log_dir: Path, model_dir: Path, torch_threads: int, max_batch_size: int, asked: bool | str
) -> tuple[RayServe | None, dict[str, Any]]:
    """Ray Serve started, not yet ready, where installed and `asked` is True; else None and why
    not. A string `asked` says why it is not asked (the state also says whether it is installed)."""
    python = ray_python()
    install = f"`{SETUP}` installs it into .venv-bench-ray"
    if asked is not True:
        missing = "" if python else f"; Ray Serve is not installed either: {install}"
        return None, {"status": "off", "reason": f"not asked ({asked}){missing}"}
    if python is None:
        return None, {"status": "skipped", "reason": f"Ray Serve is not installed: {install}, then rerun"}
    ray = RayServe(python, log_dir, model_dir, torch_threads, max_batch_size)
    return ray.launch(), {"status": "ok", "max_batch_size": max_batch_size}


def ready(ray: RayServe, state: dict[str, Any]) -> RayServe | None:
    """`ray` once it answers, its version and start time in `state`; None if it did not start."""
    try:
        ray.wait_ready()
    except Exception as exc:  # its log's tail is in the message
        drop(ray, state, exc, "did not start")
        return None
    state.update(version=ray.version, ready_s=ray.ready_s)
    print(f"   ray: Ray Serve {ray.version} ready in {ray.ready_s} s", flush=True)
    return ray


def drop(ray: RayServe, state: dict[str, Any], exc: Exception, what: str) -> None:
    """Ray failed: stop it and say so; the scenario goes on without it (its failure is not OmniRT's)."""
    ray.stop()
    state.update(status="failed", reason=f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    print(f"   ray: {state['reason']}; the scenario goes on without it\n{exc}", file=sys.stderr, flush=True)


async def post_each(url: str, bodies: list[dict[str, Any]]) -> None:
    """POST each body in turn (untimed warm-up calls)."""
    async with session() as http:
        for body in bodies:
            await post_json(http, url, body)
