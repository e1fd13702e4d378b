"""controller.edges.tls: unusable TLS flags and files are one TlsError line naming the flag and the
file; a reload hands new files to the next handshake once, and a bad file keeps the old ones."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from omnirt.controller.config import ControllerConfig
from omnirt.controller.edges.tls import ServerTls, TlsError, _PortFetcher, read_files
from tests.certs import Issued, make_ca, make_cert


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Issued, Issued, Issued]:
    ca = make_ca(tmp_path)
    return ca, make_cert(ca, tmp_path, "server"), make_cert(ca, tmp_path, "other")


def config(**fields: object) -> ControllerConfig:
    return replace(ControllerConfig(), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tls_cert": "c.pem"}, "--tls-cert c.pem: needs --tls-key"),
        ({"tls_key": "k.pem"}, "--tls-key k.pem: needs --tls-cert"),
        ({"tls_client_ca": "ca.pem"}, "--tls-client-ca ca.pem: needs --tls-cert and --tls-key"),
        ({"tls_public_client_auth": True}, "--tls-public-client-auth: needs --tls-client-ca"),
    ],
)
def test_flag_combinations_that_cannot_work(fields: dict[str, object], message: str) -> None:
    with pytest.raises(TlsError, match=f"^{message}"):
        ServerTls.from_config(config(**fields))


def test_no_tls_flags_no_tls() -> None:
    assert ServerTls.from_config(ControllerConfig()) is None


def test_unusable_files_name_the_flag_and_the_file(
    certs: tuple[Issued, Issued, Issued], tmp_path: Path
) -> None:
    _, server, other = certs
    missing = str(tmp_path / "missing.pem")
    cases = {
        (missing, server.key, ""): f"--tls-cert {missing}: cannot read: no such file or directory",
        (server.cert, missing, ""): f"--tls-key {missing}: cannot read: no such file or directory",
        (server.key, server.key, ""): f"--tls-cert {server.key}: not a PEM certificate",
        (server.cert, server.cert, ""): f"--tls-key {server.cert}: not a PEM private key",
        (
            server.cert,
            other.key,
            "",
        ): f"--tls-key {other.key}: the key does not match the certificate in {server.cert}",
        (server.cert, server.key, server.key): f"--tls-client-ca {server.key}: not a PEM certificate bundle",
        (server.cert, server.key, missing): f"--tls-client-ca {missing}: cannot read",
    }
    for (cert, key, client_ca), message in cases.items():
        with pytest.raises(TlsError) as refused:
            read_files(cert, key, client_ca)
        assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_an_encrypted_key_is_refused_without_a_prompt(
    certs: tuple[Issued, Issued, Issued], tmp_path: Path
) -> None:
    _, server, _ = certs
    key = serialization.load_pem_private_key(Path(server.key).read_bytes(), password=None)
    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsError, match="the key is encrypted"):
        read_files(server.cert, str(encrypted), "")


def test_reload_hands_new_files_to_the_next_handshake_once(
    certs: tuple[Issued, Issued, Issued], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, server, _ = certs
    tls = ServerTls(server.cert, server.key, ca.cert)
    fetcher = _PortFetcher(tls, require_client_auth=True)
    assert fetcher() is None, "nothing new: grpc keeps its SSL context"

    good_key = Path(server.key).read_bytes()
    Path(server.key).write_text("broken")
    with caplog.at_level(logging.ERROR, "omnirt.controller"):
        assert not tls.reload()
    assert f"--tls-key {server.key}: not a PEM private key" in caplog.text
    assert fetcher() is None and tls.files.generation == 0, "the certificate in use stays"

    Path(server.key).write_bytes(good_key)
    renewed = make_cert(ca, tmp_path, "server")
    assert tls.reload()
    assert fetcher() is not None and fetcher() is None, "handed over once"
    assert tls.files.cert == Path(renewed.cert).read_bytes()
