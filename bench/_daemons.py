"""Start `omnirt-controller` and `omnirt-worker` as real processes on free loopback ports.

A small copy of what tests/daemons.py does, so the benchmarks do not depend on the tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnirt.v1 import cluster_pb2, cluster_pb2_grpc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it is true; TimeoutError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def proc_status_kib(pid: int, key: str) -> int:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), in KiB; 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Daemon:
    """A child process with its output in `log_dir/NAME.log`."""

    def __init__(self, name: str, argv: list[str], log_dir: Path) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


class Controller(Daemon):
    """`omnirt-controller` on a free port."""

    def __init__(self, log_dir: Path, *extra: str) -> None:
        self.address = f"127.0.0.1:{free_port()}"
        argv = [sys.executable, "-m", "omnirt.controller.main", "--listen", self.address, *extra]
        super().__init__("controller", argv, log_dir)

    def start(self, timeout: float = 30) -> Self:
        super().start()
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            serving = health_pb2.HealthCheckResponse.SERVING

            def ready() -> bool:
                if not self.alive():
                    raise RuntimeError(f"the controller exited:\n{self.log_tail()}")
                return bool(stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == serving)

            wait_for(ready, timeout, "the controller to serve")
        return self

    def worker_ids(self) -> set[str]:
        with grpc.insecure_channel(self.address) as channel:
            stub = cluster_pb2_grpc.ClusterServiceStub(channel)
            return {w.id for w in stub.ListWorkers(cluster_pb2.ListWorkersRequest(), timeout=5).workers}

    def wait_workers(self, worker_ids: set[str], timeout: float = 120) -> None:
        wait_for(lambda: worker_ids <= self.worker_ids(), timeout, f"workers {sorted(worker_ids)} to connect")


class Worker(Daemon):
    """`omnirt-worker` serving the null model."""

    def __init__(self, log_dir: Path, controller: str, worker_id: str, *extra: str) -> None:
        self.worker_id = worker_id
        argv = [
            sys.executable,
            "-m",
            "omnirt.worker.main",
            "--controller",
            controller,
            "--worker-id",
            worker_id,
            "--model-dir",
            str(log_dir / "models"),
            "--backend",
            "cpu",
            "--torch-threads",
            "1",
            *extra,
        ]
        super().__init__(f"worker-{worker_id}", argv, log_dir)
