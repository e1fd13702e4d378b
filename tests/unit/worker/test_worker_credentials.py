"""The worker's token and TLS files: read at start (a bad one is one line naming it, exit 2),
read again before each reconnect (a file gone bad then keeps the last good one), and the flags
that imply TLS. Over real connections: tests/integration/test_worker_admission.py."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from omnirt.worker.config import WorkerConfig
from omnirt.worker.credentials import CredentialError, WorkerCredentials
from tests.certs import make_ca, make_cert

TOKEN = "wt-0123456789abcdef0123456789abcdef"


def test_the_token_goes_out_as_a_bearer_header_and_the_first_of_several_is_sent(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"# rotated 2026-01\n\n  {TOKEN}  \nwt-the-old-one\n")
    credentials = WorkerCredentials(WorkerConfig(token_file=str(path)))
    assert credentials.metadata() == (("authorization", f"Bearer {TOKEN}"),)
    assert WorkerCredentials(WorkerConfig()).metadata() == ()


@pytest.mark.parametrize(
    ("text", "problem"), [(None, "cannot read"), ("\n# nothing\n", "empty"), ("a b", "ASCII")]
)
def test_a_token_file_that_cannot_be_used_stops_the_worker_with_a_line_naming_it(
    tmp_path: Path, text: str | None, problem: str
) -> None:
    path = tmp_path / "token"
    if text is not None:
        path.write_text(text)
    with pytest.raises(CredentialError) as caught:
        WorkerCredentials(WorkerConfig(token_file=str(path)))
    assert str(caught.value).startswith(str(path)) and problem in str(caught.value)
    # The command line: exit 2, before any model is loaded or the controller dialled.
    argv = [
        sys.executable,
        "-m",
        "omnirt.worker.main",
        "--token-file",
        str(path),
        "--controller",
        "127.0.0.1:1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "worker cannot start" in errors[0] and str(path) in errors[0], errors


def test_a_rotated_token_is_read_before_the_next_connect_and_a_broken_file_keeps_the_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    credentials = WorkerCredentials(WorkerConfig(token_file=str(path)))
    path.write_text("wt-rotated-token-000000000000000\n")
    credentials.refresh()
    assert credentials.metadata() == (("authorization", "Bearer wt-rotated-token-000000000000000"),)
    path.unlink()
    with caplog.at_level(logging.WARNING):
        credentials.refresh()
    assert credentials.token == "wt-rotated-token-000000000000000"
    assert "keeping the one read before" in caplog.text and str(path) in caplog.text


def test_a_ca_a_client_certificate_or_a_server_name_implies_tls_and_cert_needs_key(tmp_path: Path) -> None:
    assert not WorkerConfig().tls
    assert WorkerConfig(tls_ca="ca.crt").tls and WorkerConfig(tls_server_name="ctl.internal").tls
    assert WorkerConfig(tls_cert="w.crt", tls_key="w.key").tls
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        WorkerConfig(tls_cert="w.crt")


def test_tls_files_are_checked_at_start(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    worker = make_cert(ca, tmp_path, "w1", client=True)
    ok = WorkerCredentials(WorkerConfig(tls_ca=ca.cert, tls_cert=worker.cert, tls_key=worker.key))
    assert ok.tls is not None and ok.tls.ca == Path(ca.cert).read_bytes()
    with pytest.raises(CredentialError, match="not a PEM CA certificate"):
        WorkerCredentials(WorkerConfig(tls_ca=worker.key))
    with pytest.raises(CredentialError, match="not a PEM private key"):
        WorkerCredentials(WorkerConfig(tls_cert=worker.cert, tls_key=worker.cert))
    with pytest.raises(CredentialError, match="cannot read the CA certificate"):
        WorkerCredentials(WorkerConfig(tls_ca=str(tmp_path / "missing.crt")))


def test_a_token_sent_in_clear_beyond_loopback_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN)
    with caplog.at_level(logging.WARNING):
        WorkerCredentials(WorkerConfig(token_file=str(path), controller="127.0.0.1:50051"))
        WorkerCredentials(WorkerConfig(token_file=str(path), controller="localhost:50051"))
        assert "without TLS" not in caplog.text
        WorkerCredentials(WorkerConfig(token_file=str(path), controller="10.0.0.5:50051"))
    assert "sending the worker token to 10.0.0.5:50051 without TLS" in caplog.text
    assert TOKEN not in caplog.text
