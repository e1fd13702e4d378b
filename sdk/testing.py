"""Start real `omnirt-controller` and `omnirt-worker` processes on free loopback ports.

For tests and benchmarks (OmniRT's own, and users' tests of code that calls OmniRT):

    controller = Controller(log_dir).start()
    worker = Worker(log_dir, controller.address, "w1", model_dir).start()
    controller.wait_worker("w1")

Needs the `[controller]` extra (the health check) and, for workers, `[worker]`.
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
from typing import TYPE_CHECKING, Any, Self

import grpc

from omnirt.v1 import cluster_pb2, cluster_pb2_grpc

if TYPE_CHECKING:
    from omnirt.client import Client


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `check` until it returns True; TimeoutError naming `what` after `timeout` seconds.

    A `grpc.RpcError` from `check` counts as "not yet" (the daemon may still be starting).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Daemon:
    """A daemon process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        """Start the process, its stdout and stderr appended to `log_path`."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        return self

    @property
    def pid(self) -> int:
        """The process id (after `start()`)."""
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the process."""
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """Wait up to `timeout` seconds for the process to exit; its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; the exit code (None if never started)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def log(self) -> str:
        """Everything the process wrote so far ("" before it wrote anything)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, chars: int = 3000) -> str:
        """The last `chars` characters of `log()`."""
        return self.log()[-chars:]


class Controller(Daemon):
    """`omnirt-controller` on a free port.

    With `tls_ca` (the CA file that signed the controller's `--tls-cert`, passed in `extra`)
    the readiness check and `workers()` connect over TLS, and `http` is an https:// URL; with
    `api_key` (an admin key of its `--auth-keys`) they send it. `client()` is an
    `omnirt.Client` with the same settings.
    """

    def __init__(
        self,
        log_dir: Path,
        *extra: str,
        port: int | None = None,
        http: bool = False,
        tls_ca: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.tls_ca = tls_ca
        self.api_key = api_key
        # The HTTP gateway's base URL with `http=True` (on a free port of its own), else "".
        scheme = "https" if tls_ca else "http"
        self.http = f"{scheme}://127.0.0.1:{free_port()}" if http else ""
        gateway = ["--http", self.http.split("://", 1)[1]] if http else []
        argv = [sys.executable, "-m", "omnirt.controller.main", "--listen", self.address, *gateway, *extra]
        super().__init__(f"controller-{self.port}", argv, log_dir)

    def channel(self) -> grpc.Channel:
        """A new channel to the controller: TLS when `tls_ca` was given (close it after use)."""
        if self.tls_ca is None:
            return grpc.insecure_channel(self.address)
        roots = Path(self.tls_ca).read_bytes()
        return grpc.secure_channel(self.address, grpc.ssl_channel_credentials(root_certificates=roots))

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The call metadata for raw stubs: the `api_key` as a bearer token, if any."""
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def client(self, **kwargs: Any) -> Client:
        """An `omnirt.Client` to this controller with its CA and key (keywords override them).

        The environment's `OMNIRT_TLS_CA` / `OMNIRT_API_KEY` do not apply: the test says.
        """
        from omnirt.client import Client

        settings: dict[str, Any] = {
            "tls": self.tls_ca is not None,
            "ca": self.tls_ca,
            "api_key": self.api_key or "",
        }
        return Client(self.address, **{**settings, **kwargs})

    def start(self, timeout: float = 30) -> Self:
        """Start the controller and wait (up to `timeout` seconds) until its health check says SERVING."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc  # the [controller] extra

        super().start()
        channel = self.channel()
        stub = health_pb2_grpc.HealthStub(channel)
        serving = health_pb2.HealthCheckResponse.SERVING

        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"controller exited:\n{self.log()}")
            return bool(stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == serving)

        try:
            wait_for(ready, timeout, "the controller to serve")
        finally:
            channel.close()
        return self

    def workers(self) -> list[cluster_pb2.WorkerInfo]:
        """The workers connected now (`ClusterService.ListWorkers`)."""
        with self.channel() as channel:
            stub = cluster_pb2_grpc.ClusterServiceStub(channel)
            request = cluster_pb2.ListWorkersRequest()
            return list(stub.ListWorkers(request, timeout=5, metadata=self.metadata()).workers)

    def worker_ids(self) -> set[str]:
        """The ids of the workers connected now."""
        return {w.id for w in self.workers()}

    def wait_workers(self, worker_ids: set[str], timeout: float = 120) -> None:
        """Wait until every one of `worker_ids` is connected."""
        wait_for(lambda: worker_ids <= self.worker_ids(), timeout, f"workers {sorted(worker_ids)} to connect")

    def wait_worker(self, worker_id: str, timeout: float = 60, present: bool = True) -> None:
        """Wait until `worker_id` is connected (or, with `present=False`, has left)."""
        wait_for(
            lambda: any(w.id == worker_id for w in self.workers()) == present,
            timeout,
            f"worker {worker_id} to {'connect' if present else 'leave'}",
        )


class Worker(Daemon):
    """`omnirt-worker` connected to a controller."""

    def __init__(self, log_dir: Path, controller: str, worker_id: str, model_dir: Path, *extra: str) -> None:
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
            str(model_dir),
            "--torch-threads",
            "1",
            *extra,
        ]
        super().__init__(f"worker-{worker_id}", argv, log_dir)


class RedisServer(Daemon):
    """A throwaway `redis-server` on a free port (nothing kept on disk), for the Redis job store.

    `stop()` then `start()` again restarts it empty on the same port, as after a crash of a
    Redis without persistence.
    """

    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(log_dir),
        ]
        super().__init__(f"redis-{self.port}", argv, log_dir)

    def start(self, timeout: float = 10) -> Self:
        """Start redis-server and wait (up to `timeout` seconds) until it answers PING."""
        super().start()

        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"redis-server exited:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    return conn.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        wait_for(ready, timeout, "redis-server to answer")
        return self


class S3Server(Daemon):
    """A real S3-compatible server process on a free loopback port: moto's, in memory.

    moto comes with `moto[server]` (the dev extra). `stop()` then `start()` again brings it
    back empty on the same port (as a store that was down); `endpoint` is its URL for
    `--artifact-store-endpoint`. Clients need some AWS credentials (moto takes any):
    `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY` in the environment.
    """

    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        super().__init__(f"s3-{self.port}", argv, log_dir)

    def start(self, timeout: float = 30) -> Self:
        """Start the server and wait (up to `timeout` seconds) until it answers HTTP."""
        super().start()

        def ready() -> bool:
            if not self.alive():
                raise RuntimeError(f"moto server exited:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"GET /moto-api/ HTTP/1.0\r\nHost: localhost\r\n\r\n")
                    return conn.recv(16).startswith(b"HTTP/")
            except OSError:
                return False

        wait_for(ready, timeout, "the S3 server to answer")
        return self
