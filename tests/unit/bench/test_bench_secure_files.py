"""bench._secure: the secured stack's files and flags, and each part alone."""

from __future__ import annotations

import ssl
import tomllib
from pathlib import Path

import pytest

from bench._secure import SecureFiles
from omnirt.controller.edges.auth import KeyRing


def test_all_parts_turn_on_tls_keys_and_the_worker_token(tmp_path: Path) -> None:
    files = SecureFiles.make(tmp_path)
    flags = files.controller_flags()
    for flag in ("--tls-cert", "--tls-key", "--auth-keys", "--worker-token-file"):
        assert flag in flags
    assert files.worker_flags() == ("--tls-ca", str(files.ca), "--token-file", str(files.token_file))
    # The certificate is one a client that trusts only the bench CA accepts for 127.0.0.1.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(files.cert, files.key)
    context = files.ssl_context()
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1
    # The key file is one the controller loads: the user key is the load's tenant, the admin key admin.
    ring = KeyRing.load(str(files.keys_file))
    user, admin = ring.lookup(files.user_key), ring.lookup(files.admin_key)
    assert user is not None and user.role == "user" and user.tenant == "bench"
    assert admin is not None and admin.is_admin
    assert files.user_key not in files.keys_file.read_text()  # digests only
    assert len(tomllib.loads(files.keys_file.read_text())["keys"]) == 2
    assert files.http_headers() == {"Authorization": f"Bearer {files.user_key}"}
    assert files.keys_file.stat().st_mode & 0o077 == 0 and files.key.stat().st_mode & 0o077 == 0


def test_one_part_alone(tmp_path: Path) -> None:
    tls = SecureFiles.make(tmp_path / "tls", "tls")
    assert "--tls-cert" in tls.controller_flags() and "--auth-keys" not in tls.controller_flags()
    assert tls.worker_flags() == ("--tls-ca", str(tls.ca)) and tls.http_headers() == {}
    assert tls.admin is None and tls.ca_path == str(tls.ca)
    keys = SecureFiles.make(tmp_path / "keys", "keys")
    assert "--tls-cert" not in keys.controller_flags() and "--auth-keys" in keys.controller_flags()
    assert keys.worker_flags() == ("--token-file", str(keys.token_file)) and keys.ssl_context() is None
    assert keys.admin == keys.admin_key and keys.ca_path is None
    none = SecureFiles.make(tmp_path / "none", "none")  # the A/A control: a second plain stack
    assert none.controller_flags() == () and none.worker_flags() == () and none.http_headers() == {}
    assert none.ssl_context() is None and none.admin is None and none.ca_path is None
    with pytest.raises(ValueError, match="parts must be one of all, tls, keys, none"):
        SecureFiles.make(tmp_path / "bad", "tls+keys")
