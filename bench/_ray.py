"""Ray Serve as a peer: its own virtualenv (bench/ray/setup.sh), run as a separate process tree.

`bench/ray/serve_app.py` runs under `.venv-bench-ray/bin/python` (or `$OMNIRT_BENCH_RAY_PYTHON`)
in a session of its own, so that stopping it can reach every process Ray started (GCS, raylet,
actors), by the session id, which is the pid this module started.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ._daemons import free_port
from ._machine import ROOT

APP = ROOT / "bench" / "ray" / "serve_app.py"
SETUP = "bash bench/ray/setup.sh"


def ray_python() -> Path | None:
    """The Ray virtualenv's interpreter, or None when it is not installed."""
    configured = os.environ.get("OMNIRT_BENCH_RAY_PYTHON")
    path = Path(configured) if configured else ROOT / ".venv-bench-ray" / "bin" / "python"
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
        self.ready_s = 0.0
        self.version = ""

    def start(self, timeout: float = 300) -> RayServe:
        """Start it and wait until every application answers (its READY line)."""
        started = time.perf_counter()
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
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
