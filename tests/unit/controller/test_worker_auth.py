"""WorkerAdmission: the worker token file, its reload, client certificates, the audit lines.

The auth contexts are shaped as grpc gives them (seen on grpcio's aio server): a TLS peer with
a verified certificate, a TLS peer without one, a plaintext peer. The integration tests
(tests/integration/test_worker_admission.py) check the same over real TLS connections.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnirt.controller.edges.audit import AuditLog
from omnirt.controller.edges.auth import KeyRing, key_digest
from omnirt.controller.edges.worker_auth import WorkerAdmission, WorkerTokenError
from omnirt.errors import Unauthenticated

TOKEN = "wt-0123456789abcdef0123456789abcdef"
NEW_TOKEN = "wt-fedcba9876543210fedcba9876543210"
PLAIN = {"transport_security_type": [b"insecure"], "security_level": [b"TSI_SECURITY_NONE"]}
TLS_NO_CERT = {"transport_security_type": [b"ssl"], "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"]}
TLS_CERT = {
    **TLS_NO_CERT,
    "x509_common_name": [b"gpu-node-7"],
    "x509_subject_alternative_name": [b"gpu-node-7.cluster.local"],
    "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----\nMIIB..."],
}


def bearer(token: str) -> list[tuple[str, str]]:
    return [("user-agent", "grpc-python"), ("authorization", f"Bearer {token}")]


@pytest.fixture
def audit_path(tmp_path: Path) -> Path:
    return tmp_path / "audit.jsonl"


def audit_lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def token_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "worker-token"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "problem"),
    [(None, "cannot read"), ("", "empty"), ("\n  \n# only a comment\n", "empty"), ("two words\n", "ASCII")],
)
def test_a_token_file_that_cannot_be_used_is_one_line_naming_it(
    tmp_path: Path, audit_path: Path, text: str | None, problem: str
) -> None:
    path = str(tmp_path / "worker-token") if text is None else token_file(tmp_path, text)
    with pytest.raises(ValueError) as caught:
        WorkerAdmission(path, AuditLog(str(audit_path)), client_ca=False)
    assert isinstance(caught.value, WorkerTokenError)
    message = str(caught.value)
    assert message.startswith(path) and problem in message and "\n" not in message
    assert "two words" not in message, "the file's content is not echoed"


def test_the_right_token_admits_and_others_are_refused_with_an_audit_line_each(
    tmp_path: Path, audit_path: Path
) -> None:
    admission = WorkerAdmission(
        token_file(tmp_path, TOKEN + "\n"), AuditLog(str(audit_path)), client_ca=False
    )
    assert admission.enabled
    assert admission.admit(bearer(TOKEN), PLAIN, "ipv4:10.0.0.5:4242", "w1") == "token"
    with pytest.raises(Unauthenticated, match="--token-file"):
        admission.admit([("user-agent", "x")], PLAIN, "ipv4:10.0.0.6:1", "rogue-1")
    with pytest.raises(Unauthenticated, match="not valid"):
        admission.admit(bearer(TOKEN + "x"), PLAIN, "ipv4:10.0.0.6:2", "rogue-2")
    with pytest.raises(Unauthenticated, match="not valid"):
        admission.admit(bearer("x" * 100_000), PLAIN, "ipv4:10.0.0.6:3", "rogue-3")
    lines = audit_lines(audit_path)
    assert [(line["outcome"], line["worker_id"], line.get("by"), line.get("reason")) for line in lines] == [
        ("admitted", "w1", "token", None),
        ("refused", "rogue-1", None, "missing_token"),
        ("refused", "rogue-2", None, "invalid_token"),
        ("refused", "rogue-3", None, "invalid_token"),
    ]
    assert all(line["event"] == "worker" for line in lines)
    assert lines[0]["peer"] == "ipv4:10.0.0.5:4242"
    assert TOKEN not in audit_path.read_text(), "the audit log never carries the token"


def test_an_api_key_is_not_a_worker_token_and_the_worker_token_is_not_an_api_key(
    tmp_path: Path, audit_path: Path
) -> None:
    api_key = "ak-admin-0123456789"
    ring = KeyRing.parse(f'[[keys]]\ntenant = "ops"\nrole = "admin"\nsha256 = "{key_digest(api_key)}"\n')
    admission = WorkerAdmission(token_file(tmp_path, TOKEN), AuditLog(str(audit_path)), client_ca=False)
    with pytest.raises(Unauthenticated):
        admission.admit(bearer(api_key), PLAIN, "p", "w1")
    assert ring.lookup(TOKEN) is None
    assert ring.lookup(api_key) is not None


def test_two_tokens_in_the_file_both_admit_while_workers_are_rolled(tmp_path: Path, audit_path: Path) -> None:
    text = f"# new token first, the old one until every worker has the new\n{NEW_TOKEN}\n\n{TOKEN}\n"
    admission = WorkerAdmission(token_file(tmp_path, text), AuditLog(str(audit_path)), client_ca=False)
    assert admission.admit(bearer(TOKEN), PLAIN, "p", "old") == "token"
    assert admission.admit(bearer(NEW_TOKEN), PLAIN, "p", "new") == "token"


def test_reload_takes_a_rotated_token_and_keeps_the_old_one_when_the_file_is_bad(
    tmp_path: Path, audit_path: Path
) -> None:
    path = token_file(tmp_path, TOKEN)
    admission = WorkerAdmission(path, AuditLog(str(audit_path)), client_ca=False)
    Path(path).write_text(NEW_TOKEN + "\n")
    assert admission.reload()
    assert admission.admit(bearer(NEW_TOKEN), PLAIN, "p", "w1") == "token"
    with pytest.raises(Unauthenticated):
        admission.admit(bearer(TOKEN), PLAIN, "p", "w-old")
    for bad in ("", None):  # emptied, then deleted: the rotated token stays in force
        if bad is None:
            Path(path).unlink()
        else:
            Path(path).write_text(bad)
        assert not admission.reload()
        assert admission.admit(bearer(NEW_TOKEN), PLAIN, "p", "w1") == "token"
    reloads = [line for line in audit_lines(audit_path) if line["event"] == "worker_token"]
    assert [line["outcome"] for line in reloads] == ["reloaded", "reload_failed", "reload_failed"]
    assert "empty" in str(reloads[1]["reason"]) and path in str(reloads[2]["reason"])


def test_with_a_client_ca_alone_a_verified_certificate_admits_and_no_certificate_does_not(
    audit_path: Path,
) -> None:
    admission = WorkerAdmission("", AuditLog(str(audit_path)), client_ca=True)
    assert admission.enabled
    assert admission.admit([], TLS_CERT, "p", "w1") == "certificate"
    for context in (TLS_NO_CERT, PLAIN, {}):
        with pytest.raises(Unauthenticated, match="--tls-cert"):
            admission.admit(bearer(TOKEN), context, "p", "rogue")
    lines = audit_lines(audit_path)
    assert (lines[0]["outcome"], lines[0]["by"], lines[0]["identity"]) == (
        "admitted",
        "certificate",
        "gpu-node-7",
    )
    assert [line["reason"] for line in lines[1:]] == ["no_certificate"] * 3


def test_with_a_token_file_and_a_client_ca_the_token_is_still_required(
    tmp_path: Path, audit_path: Path
) -> None:
    # The CA may sign the public API's clients too: their certificate does not make them workers.
    admission = WorkerAdmission(token_file(tmp_path, TOKEN), AuditLog(str(audit_path)), client_ca=True)
    with pytest.raises(Unauthenticated, match="--token-file"):
        admission.admit([], TLS_CERT, "p", "w1")
    assert admission.admit(bearer(TOKEN), TLS_CERT, "p", "w1") == "token"
    assert audit_lines(audit_path)[-1]["identity"] == "gpu-node-7"


def test_without_a_token_file_or_client_ca_every_worker_is_admitted_unaudited(audit_path: Path) -> None:
    admission = WorkerAdmission("", AuditLog(str(audit_path)), client_ca=False)
    assert not admission.enabled and not admission.reload()
    assert admission.admit([], PLAIN, "p", "w1") == "open"
    assert audit_path.read_text() == ""
