"""What the worker shows the controller (a token, a client certificate) and how it checks it (TLS).

Files are read at start, where a missing, unreadable or empty one stops the worker with a line
naming it (`CredentialError`, a ValueError: exit 2), and again before each reconnect, so a
rotated secret or a renewed certificate (a Kubernetes Secret volume, cert-manager) is used
without a restart; a file that cannot be read then keeps what was read before, with a warning.

The token file is the controller's format: one token per line, blank lines and `#` comments
left out. The worker sends the first token, so a file listing the new token above the old one
can serve controller and workers alike while a token is rotated.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from omnirt._internal.address import is_loopback
from omnirt.worker.config import WorkerConfig

log = logging.getLogger(__name__)

MAX_TOKEN_CHARS = 4096  # the controller refuses longer ones unread


class CredentialError(ValueError):
    """A token or TLS file cannot be used; the message is one line naming the file."""


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CredentialError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None


def read_token(path: str) -> str:
    """The token `path` holds (its first, when it lists several)."""
    try:
        text = _read(path, "token file").decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialError(f"{path}: the token file is not UTF-8 text") from None
    for line in text.splitlines():
        token = line.strip()
        if not token or token.startswith("#"):
            continue
        # It goes out as gRPC metadata, which takes printable ASCII only.
        if len(token) > MAX_TOKEN_CHARS or not (token.isascii() and token.isprintable()) or " " in token:
            raise CredentialError(
                f"{path}: the token must be printable ASCII without spaces, "
                f"at most {MAX_TOKEN_CHARS} characters"
            )
        return token
    raise CredentialError(f"{path}: the token file is empty")


def _pem(path: str, what: str, marker: bytes) -> bytes:
    data = _read(path, what)
    if marker not in data:  # grpc would fail later, at the handshake, without naming the file
        raise CredentialError(f"{path}: not a PEM {what} (no {marker.decode()} block)")
    return data


@dataclass(frozen=True)
class TlsFiles:
    """The PEM bytes of --tls-ca (None: the system's roots), --tls-cert and --tls-key."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None


def read_tls(config: WorkerConfig) -> TlsFiles:
    ca = _pem(config.tls_ca, "CA certificate", b"-----BEGIN CERTIFICATE-----") if config.tls_ca else None
    cert = _pem(config.tls_cert, "certificate", b"-----BEGIN CERTIFICATE-----") if config.tls_cert else None
    key = _pem(config.tls_key, "private key", b"PRIVATE KEY-----") if config.tls_key else None
    return TlsFiles(ca, cert, key)


class WorkerCredentials:
    """The token and TLS settings of one worker; `channel()` dials the controller with them."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.token = read_token(config.token_file) if config.token_file else ""  # CredentialError
        self.tls = read_tls(config) if config.tls else None
        if self.token and not config.tls and not is_loopback(config.controller):
            log.warning(
                "sending the worker token to %s without TLS: anyone on the path can read it "
                "(pass --tls-ca FILE or --tls)",
                config.controller,
            )

    def refresh(self) -> None:
        """Read the files again (before a reconnect); one that fails keeps what was read last."""
        try:
            if self.config.token_file:
                self.token = read_token(self.config.token_file)
            if self.config.tls:
                self.tls = read_tls(self.config)
        except CredentialError as exc:
            log.warning("%s; keeping the one read before", exc)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The Connect call's metadata: the token as `authorization: Bearer TOKEN`."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def channel(self, options: Sequence[tuple[str, Any]]) -> grpc.aio.Channel:
        """A channel to the controller: TLS when configured, else plaintext."""
        target, options = self.config.controller, list(options)
        if self.tls is None:
            return grpc.aio.insecure_channel(target, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.tls.ca, private_key=self.tls.key, certificate_chain=self.tls.cert
        )
        if self.config.tls_server_name:
            options = [*options, ("grpc.ssl_target_name_override", self.config.tls_server_name)]
        return grpc.aio.secure_channel(target, credentials, options=options)
