"""Throwaway certificates for TLS tests, made with `cryptography` (nothing leaves the tmp dir).

    ca = make_ca(tmp_path)                                  # a CA: ca.cert, ca.key (paths)
    server = make_cert(ca, tmp_path, "controller")          # a server cert for localhost/127.0.0.1
    worker = make_cert(ca, tmp_path, "w1", client=True)     # a client cert (CN = w1)
    ... "--tls-cert", server.cert, "--tls-key", server.key, "--tls-client-ca", ca.cert

Keys are EC P-256 (fast to make: a few ms each), PEM, unencrypted; certificates are valid from
an hour ago for a day. `serial` lets a test tell two certificates of the same name apart.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, as PEM files; `serial` is the certificate's serial number."""

    cert: str
    key: str
    serial: int


def _write(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / f"{name}.crt", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return Issued(str(cert_path), str(key_path), cert.serial_number)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=1)
    )


def make_ca(folder: str | Path, name: str = "test-ca") -> Issued:
    """A self-signed CA certificate and key in `folder` (`NAME.crt`, `NAME.key`)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return _write(Path(folder), name, builder.sign(key, hashes.SHA256()), key)


def make_cert(
    ca: Issued,
    folder: str | Path,
    name: str,
    hosts: Sequence[str] = ("localhost", "127.0.0.1"),
    client: bool = False,
) -> Issued:
    """A certificate signed by `ca` with common name `name` and `hosts` as its DNS/IP names.

    `client=True` makes a client certificate (extended key usage clientAuth) for mTLS; else a
    server certificate (serverAuth). Files: `NAME.crt`, `NAME.key` in `folder` (a second call
    with the same name overwrites them: that is how a test rotates a certificate)."""
    ca_cert = x509.load_pem_x509_certificate(Path(ca.cert).read_bytes())
    ca_key = serialization.load_pem_private_key(Path(ca.key).read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    builder = (
        _validity(x509.CertificateBuilder())
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _write(Path(folder), name, builder.sign(ca_key, hashes.SHA256()), key)
