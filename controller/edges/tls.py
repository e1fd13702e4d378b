"""TLS on the controller's edges: the gRPC ports and the HTTP gateway, reloaded on SIGHUP.

`ServerTls.from_config` reads `--tls-cert`, `--tls-key` and `--tls-client-ca` once at startup
and refuses anything unusable with a `TlsError` naming the flag and the file. Each gRPC port
gets `grpc.dynamic_ssl_server_credentials` with a fetcher of its own: grpc calls the fetcher
before every new handshake, and it hands over the files read by the last `reload()` once (then
None, "unchanged", so grpc does not rebuild its SSL context per connection). Connections
already open keep the certificate they were made with: a reload drops no stream. The HTTP
gateway's `ssl.SSLContext` is the same object for the life of the listener; a reload loads
the new chain into it, which new handshakes use.

A grpc port either requires client certificates or does not ask for them (grpc Python has no
"request but do not require"), so mTLS is decided per port: see `ControllerServer`.
"""

from __future__ import annotations

import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import grpc

if TYPE_CHECKING:
    from omnirt.controller.config import ControllerConfig

log = logging.getLogger("omnirt.controller")


class TlsError(ValueError):
    """A TLS file or flag combination cannot be used; one line naming the flag and the file."""


@dataclass(frozen=True)
class TlsFiles:
    """The PEM contents of one reading of the TLS files; `generation` counts the readings."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    generation: int


def _no_password() -> NoReturn:
    # Without a password callback OpenSSL would prompt on the terminal for an encrypted key.
    raise TlsError("encrypted")


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TlsError(f"{flag} {path}: cannot read: {(exc.strerror or str(exc)).lower()}") from None


def read_files(cert: str, key: str, client_ca: str, generation: int = 0) -> TlsFiles:
    """Read and check the files: PEM, a key matching the certificate, a usable CA bundle.

    The checks run through `ssl` (OpenSSL), which parses PEM as grpc's BoringSSL does, so a
    file that passes here does not fail later in a handshake."""
    cert_pem, key_pem = _read("--tls-cert", cert), _read("--tls-key", key)
    ca_pem = _read("--tls-client-ca", client_ca) if client_ca else None
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.load_verify_locations(cadata=cert_pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError, ValueError):
        raise TlsError(f"--tls-cert {cert}: not a PEM certificate") from None
    try:
        probe.load_cert_chain(cert, key, password=_no_password)
    except TlsError:
        raise TlsError(f"--tls-key {key}: the key is encrypted; give an unencrypted PEM key") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc).upper():
            raise TlsError(f"--tls-key {key}: the key does not match the certificate in {cert}") from None
        raise TlsError(f"--tls-key {key}: not a PEM private key") from None
    except OSError as exc:  # replaced between the two reads
        raise TlsError(f"--tls-key {key}: cannot read: {(exc.strerror or str(exc)).lower()}") from None
    if ca_pem is not None:
        try:
            probe.load_verify_locations(cadata=ca_pem.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise TlsError(f"--tls-client-ca {client_ca}: not a PEM certificate bundle") from None
    return TlsFiles(cert_pem, key_pem, ca_pem, generation)


def check_flags(config: ControllerConfig) -> None:
    """TlsError for a combination of TLS flags that cannot work."""
    if config.tls_key and not config.tls_cert:
        raise TlsError(f"--tls-key {config.tls_key}: needs --tls-cert (the certificate of the key)")
    if config.tls_cert and not config.tls_key:
        raise TlsError(f"--tls-cert {config.tls_cert}: needs --tls-key (the certificate's private key)")
    if config.tls_client_ca and not config.tls_cert:
        raise TlsError(
            f"--tls-client-ca {config.tls_client_ca}: needs --tls-cert and --tls-key "
            "(client certificates are checked only over TLS)"
        )
    if config.tls_public_client_auth and not config.tls_client_ca:
        raise TlsError(
            "--tls-public-client-auth: needs --tls-client-ca (the CA that signs client certificates)"
        )


class _PortFetcher:
    """The certificate fetcher of one gRPC port: the newest files once, then 'unchanged'."""

    def __init__(self, tls: ServerTls, require_client_auth: bool) -> None:
        self.tls = tls
        self.require_client_auth = require_client_auth
        self.seen = tls.files.generation

    def config(self, files: TlsFiles) -> grpc.ServerCertificateConfiguration:
        roots = files.client_ca if self.require_client_auth else None
        return grpc.ssl_server_certificate_configuration([(files.key, files.cert)], roots)

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by grpc's core before each handshake, on its own thread: it must not raise
        # and must not block. Two handshakes racing here both hand over the same files.
        files = self.tls.files
        if files.generation == self.seen:
            return None
        self.seen = files.generation
        return self.config(files)


class ServerTls:
    """The controller's certificate, key and client CA, and the credentials made from them."""

    def __init__(self, cert: str, key: str, client_ca: str = "") -> None:
        self.paths = (cert, key, client_ca)
        self.files = read_files(cert, key, client_ca)
        self._contexts: list[ssl.SSLContext] = []
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: ControllerConfig) -> ServerTls | None:
        """The TLS of `config`, or None without --tls-cert; TlsError for unusable flags or files."""
        check_flags(config)
        if not config.tls_cert:
            return None
        return cls(config.tls_cert, config.tls_key, config.tls_client_ca)

    def grpc_credentials(self, *, require_client_auth: bool) -> grpc.ServerCredentials:
        """Credentials for one gRPC port; `require_client_auth` needs a client CA."""
        if require_client_auth and self.files.client_ca is None:
            raise TlsError("client certificates need --tls-client-ca")
        fetcher = _PortFetcher(self, require_client_auth)
        return grpc.dynamic_ssl_server_credentials(
            fetcher.config(self.files),
            # The stub's type leaves out the documented None ("unchanged") a fetcher may return.
            cast(Callable[[], grpc.ServerCertificateConfiguration], fetcher),
            require_client_authentication=require_client_auth,
        )

    def ssl_context(self, *, require_client_auth: bool) -> ssl.SSLContext:
        """A server context for the HTTP gateway (TLS 1.2 and up), kept current by `reload`."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_into(context, self.files, require_client_auth)
        if require_client_auth:
            context.verify_mode = ssl.CERT_REQUIRED
        self._contexts.append(context)
        return context

    def _load_into(self, context: ssl.SSLContext, files: TlsFiles, client_ca: bool) -> None:
        cert, key, _ = self.paths
        # From the paths (ssl reads only files); `files` was read from them just before and
        # checked on a scratch context, so a failure here means they changed in between.
        context.load_cert_chain(cert, key, password=_no_password)
        if client_ca and files.client_ca is not None:
            # Adds to the trusted set: a CA taken out of the file stays trusted by the HTTP
            # gateway until a restart (the gRPC ports take the new bundle as it is).
            context.load_verify_locations(cadata=files.client_ca.decode("ascii"))

    def reload(self) -> bool:
        """Read the files again (SIGHUP) for new handshakes; a bad file keeps the old ones."""
        cert, key, client_ca = self.paths
        with self._lock:
            try:
                files = read_files(cert, key, client_ca, self.files.generation + 1)
            except TlsError as exc:
                log.error("TLS reload failed, the certificate in use stays: %s", exc)
                return False
            for context in self._contexts:
                try:
                    self._load_into(context, files, context.verify_mode == ssl.CERT_REQUIRED)
                except (ssl.SSLError, OSError, TlsError) as exc:
                    log.error("TLS reload of the HTTP gateway failed: %s: %s", cert, exc)
                    return False
            self.files = files  # the gRPC fetchers hand these to the next handshake
        log.info("TLS certificate reloaded from %s", cert)
        return True
