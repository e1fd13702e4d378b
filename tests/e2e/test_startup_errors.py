"""A daemon that cannot listen says so in one line and exits 2, without a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import free_port

# The console scripts, as a user starts them.
CONTROLLER = str(Path(sys.executable).with_name("omnirt-controller"))
WORKER = str(Path(sys.executable).with_name("omnirt-worker"))


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A loopback port some other program is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _assert_one_clear_line(proc: subprocess.CompletedProcess[str], prog: str, address: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"{prog}: cannot listen on {address}: address in use"], proc.stderr


def test_controller_on_a_busy_grpc_port(busy_port: int) -> None:
    address = f"127.0.0.1:{busy_port}"
    proc = _run([CONTROLLER, "--listen", address])
    _assert_one_clear_line(proc, "omnirt-controller", address)


def test_controller_on_a_busy_http_port(busy_port: int) -> None:
    address = f"127.0.0.1:{busy_port}"
    listen = f"127.0.0.1:{free_port()}"
    proc = _run([CONTROLLER, "--listen", listen, "--http", address])
    _assert_one_clear_line(proc, "omnirt-controller", address)


def test_worker_on_a_busy_metrics_port(busy_port: int) -> None:
    address = f"127.0.0.1:{busy_port}"
    controller = f"127.0.0.1:{free_port()}"  # nobody there: the worker must fail before connecting
    proc = _run([WORKER, "--controller", controller, "--metrics", address])
    _assert_one_clear_line(proc, "omnirt-worker", address)
