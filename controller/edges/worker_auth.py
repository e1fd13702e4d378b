"""Worker admission: who may open the worker stream and so receive users' jobs.

A worker is admitted at Hello, before the engine hears of it, by:

- the **token** of `--worker-token-file`, sent as `authorization: Bearer TOKEN` metadata on the
  Connect stream. The file holds one token per line (blank lines and `#` comments ignored):
  two lines let old and new token both work while workers are rolled to the new one. It is
  read again on SIGHUP; a file that became unreadable or empty keeps the tokens in force.
- else, with `--tls-client-ca` and no token file, its **client certificate**: the TLS
  handshake of the worker port requires one and verifies it against that CA (grpc puts a peer
  certificate in the auth context only then), so a certificate there is one the CA signed,
  and stands for the token. With a token file too, the token is required all the same: the CA
  may also sign the public API's clients (`--tls-public-client-auth`), who are not workers.

Tokens are compared as SHA-256 digests with `hmac.compare_digest`, against every token of the
file: the time a check takes says nothing about the token. API keys (`--auth-keys`) and worker
tokens are separate secrets: neither is accepted in place of the other. Every admission and
refusal is an audit line, never with the token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from omnirt.controller.edges.audit import AuditLog
from omnirt.controller.edges.auth import MAX_KEY_CHARS, bearer
from omnirt.errors import Unauthenticated

# grpc's auth context: `transport_security_type` is b"ssl" on a TLS connection, and a peer
# certificate (verified by the handshake) shows as `x509_pem_cert` with its names.
SSL = b"ssl"


class WorkerTokenError(ValueError):
    """The worker token file cannot be used; the message is one line naming the file."""


def parse_tokens(text: str, source: str) -> list[str]:
    """The tokens of a token file: one per line, blank lines and `#` comments left out."""
    tokens = [line.strip() for line in text.splitlines()]
    tokens = [token for token in tokens if token and not token.startswith("#")]
    if not tokens:
        raise WorkerTokenError(f"{source}: the worker token file is empty")
    for number, token in enumerate(tokens, 1):
        # It travels as gRPC metadata: printable ASCII without spaces, or no worker can send it.
        if len(token) > MAX_KEY_CHARS or not (token.isascii() and token.isprintable()) or " " in token:
            raise WorkerTokenError(
                f"{source}: token {number} must be printable ASCII without spaces, "
                f"at most {MAX_KEY_CHARS} characters"
            )
    return tokens


def load_digests(path: str) -> list[bytes]:
    """The SHA-256 digests of the tokens in `path` (the tokens themselves are not kept)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise WorkerTokenError(f"{path}: cannot read the worker token file: {reason}") from None
    return [_digest(token) for token in parse_tokens(text, path)]


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _first(context: Mapping[str, Iterable[bytes]], name: str) -> str:
    value = next(iter(context.get(name) or ()), b"")
    return value.decode("utf-8", "replace")


def certificate_identity(auth_context: Mapping[str, Iterable[bytes]]) -> str:
    """The name of the TLS peer's certificate (common name, else first SAN), or "" without one."""
    if SSL not in (auth_context.get("transport_security_type") or ()):
        return ""
    if not next(iter(auth_context.get("x509_pem_cert") or ()), b""):
        return ""
    return (
        _first(auth_context, "x509_common_name")
        or _first(auth_context, "x509_subject_alternative_name")
        or "(certificate without a name)"
    )


class WorkerAdmission:
    """Decides at Hello whether a worker stream may join; shared by every port serving it."""

    def __init__(self, token_file: str, audit: AuditLog, *, client_ca: bool) -> None:
        self.path = token_file
        self.audit = audit
        self.client_ca = client_ca
        # WorkerTokenError (a ValueError) at startup: missing, unreadable or empty file.
        self._digests: list[bytes] = load_digests(token_file) if token_file else []

    @property
    def enabled(self) -> bool:
        """Whether workers must prove anything (a token file, or client certificates)."""
        return bool(self.path) or self.client_ca

    def reload(self) -> bool:
        """Read the token file again (SIGHUP); a bad or missing file keeps the tokens in force."""
        if not self.path:
            return False
        try:
            digests = load_digests(self.path)
        except WorkerTokenError as exc:
            self.audit.record("worker_token", "reload_failed", reason=str(exc))
            return False
        self._digests = digests
        self.audit.record("worker_token", "reloaded", tokens=len(digests))
        return True

    def token_valid(self, token: str) -> bool:
        """Whether `token` is a worker token of the file."""
        return bool(self.path) and len(token) <= MAX_KEY_CHARS and self._token_matches(token)

    def carries_token(self, metadata: Iterable[tuple[str, Any]], auth_context: object = None) -> bool:
        """A call with a valid worker token: it may read the catalog
        (`auth.CATALOG_SERVICE`) on the public port."""
        token = bearer(metadata)
        return token is not None and self.token_valid(token)

    def admitted(
        self, metadata: Iterable[tuple[str, Any]], auth_context: Mapping[str, Iterable[bytes]]
    ) -> bool:
        """A call an admitted worker could make on the worker port: its token, or (client
        certificates required there, no token file) its certificate. It may read the catalog."""
        if self.path:
            return self.carries_token(metadata)
        return self.client_ca and bool(certificate_identity(auth_context))

    def _token_matches(self, token: str) -> bool:
        digest = _digest(token)
        matched = False
        for stored in self._digests:  # every one, no early exit
            matched |= hmac.compare_digest(stored, digest)
        return matched

    def admit(
        self,
        metadata: Iterable[tuple[str, Any]],
        auth_context: Mapping[str, Iterable[bytes]],
        peer: str,
        worker_id: str,
    ) -> str:
        """How the worker is admitted: "certificate", "token" or "open" (nothing asked).

        Raises Unauthenticated, with what the worker must present, when it is not."""
        if not self.enabled:
            return "open"
        identity = certificate_identity(auth_context) if self.client_ca else ""
        seen = {"identity": identity} if identity else {}
        if not self.path and identity:
            self.audit.record("worker", "admitted", peer=peer, worker_id=worker_id, by="certificate", **seen)
            return "certificate"
        token = bearer(metadata)
        if self.path and token is not None and len(token) <= MAX_KEY_CHARS and self._token_matches(token):
            self.audit.record("worker", "admitted", peer=peer, worker_id=worker_id, by="token", **seen)
            return "token"
        if not self.path:
            reason, message = (
                "no_certificate",
                "this controller admits workers by client certificate: start the worker with "
                "--tls-cert FILE --tls-key FILE (signed by the controller's --tls-client-ca)",
            )
        elif token is None:
            reason, message = (
                "missing_token",
                "this controller admits workers with a token: start the worker with --token-file FILE "
                "(the token of the controller's --worker-token-file)",
            )
        else:
            reason, message = "invalid_token", "the worker token is not valid"
        self.audit.failure("worker", "refused", peer=peer, worker_id=worker_id, reason=reason, **seen)
        raise Unauthenticated(message)
