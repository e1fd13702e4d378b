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


# ---- secure by default ----------------------------------------------------------------------


def _key_file(tmp_path: Path, text: str | None = None) -> Path:
    from omnirt.controller.edges.auth import key_digest

    path = tmp_path / "keys.toml"
    path.write_text(
        text
        if text is not None
        else f'[[keys]]\ntenant = "ops"\nrole = "admin"\nsha256 = "{key_digest("k")}"\n'
    )
    return path


def _refused(argv: list[str]) -> str:
    proc = _run(argv)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.mark.parametrize("flag", ["--listen", "--http"])
def test_controller_refuses_a_public_address_without_api_keys(flag: str) -> None:
    address = f"0.0.0.0:{free_port()}"
    argv = [CONTROLLER, flag, address] if flag == "--listen" else [CONTROLLER, "--http", address]
    line = _refused(argv)
    assert line.startswith(f"omnirt-controller: refusing to serve {address} without API keys"), line
    assert "--auth-keys" in line and "--insecure" in line


def test_controller_refuses_a_public_worker_port_without_a_worker_token(tmp_path: Path) -> None:
    address = f"0.0.0.0:{free_port()}"
    line = _refused([CONTROLLER, "--listen", address, "--auth-keys", str(_key_file(tmp_path))])
    assert line.startswith(
        f"omnirt-controller: refusing to accept workers on {address} without a worker token"
    )
    assert "--worker-token-file" in line


def test_insecure_serves_a_public_address_without_keys() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [CONTROLLER, "--listen", f"0.0.0.0:{port}", "--insecure"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("omnirt-controller listening on 0.0.0.0:"), line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(
    "text, says",
    [
        (
            "[[keys]]\ntenant = 'a'\nrole = 'root'\nsha256 = '" + "0" * 64 + "'\n",
            "key 1: role must be user or admin",
        ),
        ("[[keys]]\ntenant = 'a b'\nsha256 = '" + "0" * 64 + "'\n", "key 1: tenant must be"),
        ("[[keys]]\ntenant = 'a'\nsha256 = 'secret-in-clear'\n", "key 1: sha256 must be 64 hex digits"),
        (
            "[[keys]]\ntenant = 'a'\nsha256 = '" + "0" * 64 + "'\nmax_queued = -1\n",
            "max_queued must be an integer >= 0",
        ),
        ("keys = 3\n", "expected only [[keys]] tables"),
        ("[[keys]\n", "not valid TOML"),
    ],
)
def test_controller_refuses_a_bad_key_file(tmp_path: Path, text: str, says: str) -> None:
    path = _key_file(tmp_path, text)
    line = _refused([CONTROLLER, "--listen", f"127.0.0.1:{free_port()}", "--auth-keys", str(path)])
    assert line.startswith(f"omnirt-controller: {path}: "), line
    assert says in line, line


def test_controller_refuses_a_missing_key_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    line = _refused([CONTROLLER, "--listen", f"127.0.0.1:{free_port()}", "--auth-keys", str(path)])
    assert line.startswith(f"omnirt-controller: {path}: cannot read"), line
