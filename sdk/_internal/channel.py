"""A client's channel, set up once for `omnirt.Client` and `omnirt.AsyncClient`.

`ChannelSettings.of` turns the constructor's arguments (address, TLS files, API key, channel
options) and the `OMNIRT_*` variables into checked settings; `open_channel` and
`open_aio_channel` open a grpc or a grpc.aio channel from them. The API key travels in an
interceptor, written once (`_KeyEntry`) with a thin adapter per grpc flavour: the sync and the
aio interceptor base classes are different classes with different call-details types.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import os
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from omnirt._internal.limits import MAX_MESSAGE_BYTES

DEFAULT_PORT = 50051
DEFAULT_ADDRESS = f"127.0.0.1:{DEFAULT_PORT}"
ADDRESS_ENV = "OMNIRT_CONTROLLER"
TLS_CA_ENV = "OMNIRT_TLS_CA"  # a CA file: connect over TLS and trust it
API_KEY_ENV = "OMNIRT_API_KEY"

PathArg = str | os.PathLike[str]
Metadata = Sequence[tuple[str, str]]


def default_address() -> str:
    """The controller address: `$OMNIRT_CONTROLLER`, else 127.0.0.1:50051."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def with_default_port(address: str) -> str:
    """`address` with the controller's port (50051) when it names none.

    gRPC's own default is 443, where an OmniRT controller never listens. Targets with a scheme
    (`unix:`, `dns:///`, `ipv4:`) are gRPC's to read and stay as given.
    """
    address = address.strip()
    if not address or "/" in address:
        return address
    if address.startswith("["):
        return address if "]:" in address else f"{address}:{DEFAULT_PORT}"
    colons = address.count(":")
    if colons == 1:
        return address  # host:port, or a scheme target (unix:name, ipv4:1.2.3.4)
    if colons > 1:
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            return address  # ipv4:1.2.3.4:5, or an IPv6 address with a zone gRPC reads itself
        return f"[{address}]:{DEFAULT_PORT}"
    return f"{address}:{DEFAULT_PORT}"


def channel_options(options: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """Explicit message-size limits, overridden by any of the caller's `options`."""
    merged = {
        "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
        "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    }
    merged.update(dict(options))
    return list(merged.items())


def _refuse_password() -> bytes:
    # Without a callback OpenSSL would stop and prompt on the terminal for an encrypted key.
    raise ValueError("key: the private key is encrypted; give an unencrypted PEM key")


def channel_credentials(
    tls: bool | None, ca: PathArg | None, cert: PathArg | None, key: PathArg | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials from a client's `tls`, `ca`, `cert` and `key` arguments, or None (plaintext).

    `ca` defaults to `$OMNIRT_TLS_CA` unless `tls=False`; a CA or a client certificate implies
    TLS; `tls=True` alone trusts the system's root certificates. The files are read here, once,
    and checked (ValueError naming the argument and the file), so a wrong file is not a
    handshake failure later. An unreadable file raises its OSError.
    """
    if ca is None and tls is not False:
        ca = os.environ.get(TLS_CA_ENV) or None
    if (cert is None) != (key is None):
        raise ValueError("cert= and key= go together: a client certificate and its private key")
    if tls is None:
        tls = ca is not None or cert is not None
    if not tls:
        if ca is not None or cert is not None:
            raise ValueError("ca=, cert= and key= need TLS, and tls=False was given")
        return None
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    roots = None
    if ca is not None:
        roots = Path(ca).read_bytes()
        try:
            probe.load_verify_locations(cadata=roots.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise ValueError(f"ca: {os.fspath(ca)}: not a PEM certificate bundle") from None
    chain = private = None
    if cert is not None and key is not None:
        chain, private = Path(cert).read_bytes(), Path(key).read_bytes()
        try:
            probe.load_cert_chain(cert, key, password=_refuse_password)
        except ssl.SSLError as exc:
            what = (
                "does not match the certificate"
                if "KEY_VALUES_MISMATCH" in str(exc).upper()
                else "is not PEM"
            )
            raise ValueError(f"cert/key: {os.fspath(cert)} / {os.fspath(key)}: the key {what}") from None
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=private, certificate_chain=chain)


def api_key_or_env(api_key: str | None) -> str:
    """The API key to send: `api_key`, else `$OMNIRT_API_KEY`, else "" (none; "" also turns off the env).

    ValueError when it cannot travel as a gRPC header (never with the key in the message).
    """
    key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
    key = key.strip()
    if key and not (key.isascii() and key.isprintable() and " " not in key):
        raise ValueError("api_key: must be printable ASCII without spaces")
    return key


def bearer_entry(api_key: str) -> tuple[str, str]:
    """The metadata entry that carries `api_key`."""
    return ("authorization", f"Bearer {api_key}")


@dataclasses.dataclass(frozen=True)
class ChannelSettings:
    """A client's constructor arguments, resolved and checked once (the key never in its repr)."""

    address: str
    options: list[tuple[str, Any]]
    credentials: grpc.ChannelCredentials | None  # None: plaintext
    api_key: str = dataclasses.field(default="", repr=False)  # "": send none

    @classmethod
    def of(
        cls,
        address: str | None,
        *,
        options: Sequence[tuple[str, Any]],
        credentials: grpc.ChannelCredentials | None,
        tls: bool | None,
        ca: PathArg | None,
        cert: PathArg | None,
        key: PathArg | None,
        api_key: str | None,
    ) -> ChannelSettings:
        """The settings of `Client(...)` / `AsyncClient(...)`; ValueError on arguments that cannot work."""
        if credentials is not None and (tls or ca is not None or cert is not None):
            raise ValueError("give credentials= or tls=/ca=/cert=/key=, not both")
        if credentials is None:
            credentials = channel_credentials(tls, ca, cert, key)
        return cls(
            with_default_port(address or default_address()),
            channel_options(options),
            credentials,
            api_key_or_env(api_key),
        )


def open_channel(settings: ChannelSettings) -> tuple[grpc.Channel, grpc.Channel]:
    """A blocking channel: (the one to close, the one to call through, with the key when there is one)."""
    if settings.credentials is None:
        raw = grpc.insecure_channel(settings.address, options=settings.options)
    else:
        raw = grpc.secure_channel(settings.address, settings.credentials, options=settings.options)
    if not settings.api_key:
        return raw, raw
    return raw, grpc.intercept_channel(raw, BearerKeyInterceptor(settings.api_key))


def open_aio_channel(settings: ChannelSettings) -> grpc.aio.Channel:
    """A grpc.aio channel (create it inside the running event loop), with the key when there is one."""
    interceptors = key_interceptors(settings.api_key)
    if settings.credentials is None:
        return grpc.aio.insecure_channel(
            settings.address, options=settings.options, interceptors=interceptors
        )
    return grpc.aio.secure_channel(
        settings.address, settings.credentials, options=settings.options, interceptors=interceptors
    )


# ---- the key's interceptor: the logic once, one adapter per grpc flavour ---------------------


class _KeyEntry:
    """Adds `authorization: Bearer KEY` to a call's metadata, the raw stubs' calls included.

    An interceptor rather than call credentials: grpc sends those only over TLS, and a
    controller on loopback may check keys without TLS.
    """

    def __init__(self, api_key: str) -> None:
        self._entry = bearer_entry(api_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<key>)"

    def _metadata(self, details: Any) -> tuple[tuple[str, Any], ...]:
        return (*(details.metadata or ()), self._entry)


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """A call's details with other metadata (grpc's own class cannot be built)."""


class BearerKeyInterceptor(
    _KeyEntry,
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """The key's interceptor for a blocking channel (one class serves the four call kinds)."""

    def _details(self, details: Any) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            self._metadata(details),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request_iterator)


class _AioKey(_KeyEntry):
    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*self._metadata(details))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files an interceptor under the first call kind it implements: one class per kind.
class _UnaryUnaryKey(_AioKey, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStreamKey(_AioKey, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnaryKey(_AioKey, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStreamKey(_AioKey, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def key_interceptors(api_key: str) -> list[Any]:
    """The interceptors that send `api_key` with every call of a grpc.aio channel (none without one)."""
    if not api_key:
        return []
    return [kind(api_key) for kind in (_UnaryUnaryKey, _UnaryStreamKey, _StreamUnaryKey, _StreamStreamKey)]
