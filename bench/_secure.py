"""What a secured OmniRT needs, made in a scratch folder: certificates, a key file, a worker token.

`SecureFiles.make(folder)` writes a throwaway CA and a server certificate for 127.0.0.1 (EC
P-256, `cryptography`; bench does not import the tests' helpers), a key file with one user key
(the load's) and one admin key (only for the harness's ListWorkers check), and the worker join
token. `controller_flags()` and `worker_flags()` turn everything on: TLS on gRPC and on the
HTTP gateway, `--auth-keys`, `--worker-token-file`; workers verify the controller with
`--tls-ca` and send `--token-file`. `refusals()` checks that the controller really refuses
what it should before anything is measured.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import omnirt
from omnirt.controller.edges.auth import key_digest
from omnirt.errors import OmniRTError

TENANT = "bench"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _signed(
    subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey, signer: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_server_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 and localhost signed by it: (ca, cert, key)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        _signed("omnirt-bench-ca", _name("omnirt-bench-ca"), ca_key.public_key(), ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    hosts = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    cert = (
        _signed("omnirt-bench-controller", ca.subject, key.public_key(), ca_key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(hosts), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "ca.crt", folder / "controller.crt", folder / "controller.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(_pem_key(key))
    paths[2].chmod(0o600)
    return paths


# "none": a second stack exactly like the plain one, the A/A control: how far apart two equal
# stacks measure on this machine, the noise any secure/plain ratio has to be read against.
PARTS = ("all", "tls", "keys", "none")


@dataclass(frozen=True)
class SecureFiles:
    """The files and secrets of one secured controller and its workers.

    `tls` and `keys` say what is on (both, unless the bench was asked for one part alone, to
    see what each costs, or for none): TLS on gRPC, the HTTP gateway and the worker stream; the
    API keys and the worker token."""

    ca: Path
    cert: Path
    key: Path
    keys_file: Path
    token_file: Path
    user_key: str
    admin_key: str
    tls: bool = True
    keys: bool = True

    @classmethod
    def make(cls, folder: Path, parts: str = "all") -> SecureFiles:
        if parts not in PARTS:
            raise ValueError(f"parts must be one of {', '.join(PARTS)}, got {parts!r}")
        ca, cert, key = make_server_cert(folder)
        user_key, admin_key, token = (secrets.token_urlsafe(32) for _ in range(3))
        keys_file = folder / "keys.toml"
        keys_file.write_text(
            f'[[keys]]\ntenant = "{TENANT}"\nrole = "user"\nsha256 = "{key_digest(user_key)}"\n\n'
            f'[[keys]]\ntenant = "bench-ops"\nrole = "admin"\nsha256 = "{key_digest(admin_key)}"\n'
        )
        token_file = folder / "worker-token"
        token_file.write_text(token + "\n")
        for path in (keys_file, token_file):
            path.chmod(0o600)
        on = {"tls": parts in ("all", "tls"), "keys": parts in ("all", "keys")}
        return cls(ca, cert, key, keys_file, token_file, user_key, admin_key, **on)

    def controller_flags(self) -> tuple[str, ...]:
        tls = ("--tls-cert", str(self.cert), "--tls-key", str(self.key)) if self.tls else ()
        keys = ("--auth-keys", str(self.keys_file), "--worker-token-file", str(self.token_file))
        return (*tls, *(keys if self.keys else ()))

    def worker_flags(self) -> tuple[str, ...]:
        # The worker's own token file: the same token the controller admits.
        tls = ("--tls-ca", str(self.ca)) if self.tls else ()
        return (*tls, *(("--token-file", str(self.token_file)) if self.keys else ()))

    @property
    def ca_path(self) -> str | None:
        """The CA to verify the controller by (None without TLS)."""
        return str(self.ca) if self.tls else None

    @property
    def admin(self) -> str | None:
        """The admin key, for the harness's ListWorkers (None without keys)."""
        return self.admin_key if self.keys else None

    def client(self, address: str) -> omnirt.AsyncClient:
        """The load's client: TLS verified by the bench CA, the user key."""
        return omnirt.AsyncClient(
            address, tls=self.tls, ca=self.ca_path, api_key=self.user_key if self.keys else ""
        )

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context that trusts the bench CA (the HTTP leg over https)."""
        return ssl.create_default_context(cafile=str(self.ca)) if self.tls else None

    def http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.user_key}"} if self.keys else {}


async def refusals(address: str, http_url: str, files: SecureFiles) -> dict[str, str]:
    """How the secured controller answers a call without a key and one in plaintext, by name.

    The bench checks these before it measures, so that it never reports the cost of a stack
    that is not in fact secured: RuntimeError when any of them is answered."""

    async def refused(client: omnirt.AsyncClient) -> str:
        try:
            async with client:
                await client.generate(model="null", prompt="refused", timeout=10)
        except OmniRTError as exc:
            return exc.code.name
        except grpc.RpcError as exc:
            return exc.code().name
        return "answered"

    found = {}
    if files.keys:
        keyless = omnirt.AsyncClient(address, tls=files.tls, ca=files.ca_path, api_key="")
        found["grpc_without_key"] = await refused(keyless)
    if files.tls:
        plaintext = omnirt.AsyncClient(address, tls=False, api_key=files.user_key if files.keys else "")
        found["grpc_plaintext"] = await refused(plaintext)
    if http_url and files.keys:
        async with aiohttp.ClientSession() as http:
            body = {"model": "null", "prompt": "refused"}
            ssl_context = files.ssl_context() or True
            async with http.post(f"{http_url}/v1/generate", json=body, ssl=ssl_context) as answer:
                found["http_without_key"] = f"HTTP_{answer.status}"
    if "answered" in found.values() or found.get("http_without_key") == "HTTP_200":
        raise RuntimeError(f"the secured controller answered a call it should refuse: {found}")
    return found
