"""API keys: who is calling, as which tenant and role, checked once per call on both edges.

The key file (`--auth-keys`, TOML) lists keys by their SHA-256 only, never in clear:

    [[keys]]
    tenant = "alice"        # letters, digits, . _ -; at most 64
    role = "user"           # user | admin
    sha256 = "<64 hex digits: sha256 of the key>"
    name = "alice-ci"       # optional: names the key in the audit log
    max_queued = 100        # optional quotas of the tenant (0 or absent = none)
    rate_per_s = 10
    burst = 20
    weight = 1              # share of dispatch against other tenants (default 1)

Clients send `authorization: Bearer KEY` (gRPC metadata or HTTP header). The key is hashed and
the digest looked up, then confirmed with `hmac.compare_digest`: the time a lookup takes says
nothing about the key. Without a key file every call is the anonymous admin, as before auth.

The caller of the call being served is a context variable (`CURRENT`), set by the gRPC
interceptor and the HTTP middleware. Its default is `NOBODY`, which `caller()` refuses: a code
path that forgot to authenticate fails closed.

Which methods need what is decided by service, from the descriptors (`needs`, used by the gRPC
`AuthInterceptor` below and by the HTTP gateway), so a new RPC cannot be left open by mistake:
every method of `GenerationService`, `ModelService` and `RealtimeService` needs a key, every
method of `ClusterService` (and any later management service named in `ADMIN_SERVICES`) an
admin key, and so do the management methods of a user service named in `ADMIN_METHODS`
(ModelService's LoadModel and UnloadModel: they change what the workers hold; an admitted
worker's token, which may read the catalog, may not call them). Health and reflection stay open
(probes, grpcurl: they show nothing of anyone's jobs), and the worker stream is admitted by its
own token (`worker_auth.py`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import math
import re
import tomllib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from omnirt.controller.core.tenants import UNLIMITED, TenantPolicy
from omnirt.controller.edges.audit import AuditLog
from omnirt.controller.edges.interceptors import WrappingInterceptor
from omnirt.errors import PermissionDenied, Unauthenticated
from omnirt.v1 import cluster_pb2, generation_pb2, models_pb2, realtime_pb2

ROLES = ("user", "admin")
TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
HEX_RE = re.compile(r"[0-9a-f]{64}")
POLICY_FIELDS = {"max_queued", "rate_per_s", "burst", "weight"}
KEY_FIELDS = {"tenant", "role", "sha256", "name"} | POLICY_FIELDS
MAX_KEY_CHARS = 4096  # a presented key longer than this is refused before hashing


@dataclass(frozen=True)
class Principal:
    """The caller of one call: its tenant, role and the tenant's policy."""

    tenant: str
    role: str  # "user", "admin", or "" for NOBODY
    key_name: str = ""  # the key's `name` (audit log), never the key
    policy: TenantPolicy = field(default=UNLIMITED)

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    @property
    def scope(self) -> str | None:
        """The tenant whose jobs this caller may see; None = all (admins)."""
        return None if self.is_admin else self.tenant


ANONYMOUS = Principal(tenant="", role="admin", key_name="anonymous")  # auth is off
NOBODY = Principal(tenant="", role="")

CURRENT: ContextVar[Principal] = ContextVar("omnirt_caller", default=NOBODY)


def caller() -> Principal:
    """The authenticated caller of the call being served."""
    principal = CURRENT.get()
    if not principal.role:
        raise Unauthenticated("this call was not authenticated")
    return principal


class KeyFileError(ValueError):
    """The key file cannot be used; the message names the file and the entry."""


def _number(entry: dict[str, Any], name: str, where: str, *, integer: bool) -> float:
    value = entry.get(name, 0 if name != "weight" else 1)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < 0:
        kind = "an integer" if integer else "a number"
        raise KeyFileError(f"{where}: {name} must be {kind} >= 0, got {value!r}")
    if name == "weight" and value <= 0:
        raise KeyFileError(f"{where}: weight must be > 0, got {value!r}")
    return value


def _policy(entry: dict[str, Any], where: str) -> TenantPolicy:
    return TenantPolicy(
        max_queued=int(_number(entry, "max_queued", where, integer=True)),
        rate_per_s=float(_number(entry, "rate_per_s", where, integer=False)),
        burst=int(_number(entry, "burst", where, integer=True)),
        weight=float(_number(entry, "weight", where, integer=False)),
    )


@dataclass(frozen=True)
class KeyRing:
    """The keys of one key file, by the SHA-256 digest of the key."""

    by_digest: dict[bytes, Principal]

    def __len__(self) -> int:
        return len(self.by_digest)

    @classmethod
    def parse(cls, text: str, source: str = "key file") -> KeyRing:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise KeyFileError(f"{source}: not valid TOML: {exc}") from None
        entries = data.get("keys", [])
        if set(data) - {"keys"} or not isinstance(entries, list):
            raise KeyFileError(f"{source}: expected only [[keys]] tables")
        found: list[tuple[bytes, str, str, str]] = []
        # Quotas belong to the tenant: the keys that state them must agree, and a key that
        # states none (a rotated key added beside the old one) has the tenant's.
        policies: dict[str, tuple[TenantPolicy, str]] = {}
        for number, entry in enumerate(entries, 1):
            where = f"{source}: key {number}"
            if not isinstance(entry, dict):
                raise KeyFileError(f"{where}: expected a table")
            unknown = set(entry) - KEY_FIELDS
            if unknown:
                raise KeyFileError(f"{where}: unknown field {sorted(unknown)[0]!r}")
            tenant, role, digest = entry.get("tenant"), entry.get("role", "user"), entry.get("sha256")
            if not isinstance(tenant, str) or not TENANT_RE.fullmatch(tenant):
                raise KeyFileError(f"{where}: tenant must be 1-64 letters, digits, '.', '_' or '-'")
            if role not in ROLES:
                raise KeyFileError(f"{where}: role must be user or admin, got {role!r}")
            if not isinstance(digest, str) or not HEX_RE.fullmatch(digest.lower()):
                raise KeyFileError(f"{where}: sha256 must be 64 hex digits (the key's SHA-256)")
            name = entry.get("name", f"{tenant}#{number}")
            if not isinstance(name, str) or len(name) > 128:
                raise KeyFileError(f"{where}: name must be a string of at most 128 characters")
            policy = _policy(entry, where)
            if set(entry) & POLICY_FIELDS:
                earlier = policies.setdefault(tenant, (policy, where))
                if earlier[0] != policy:
                    raise KeyFileError(f"{where}: tenant {tenant!r} has other quotas in {earlier[1]}")
            raw = bytes.fromhex(digest)
            if any(raw == seen[0] for seen in found):
                raise KeyFileError(f"{where}: the same key is listed twice")
            found.append((raw, tenant, role, name))
        keys = {
            raw: Principal(
                tenant=tenant, role=role, key_name=name, policy=policies.get(tenant, (UNLIMITED, ""))[0]
            )
            for raw, tenant, role, name in found
        }
        return cls(keys)

    @classmethod
    def load(cls, path: str) -> KeyRing:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise KeyFileError(f"{path}: cannot read: {exc}") from None
        return cls.parse(text, path)

    def lookup(self, key: str) -> Principal | None:
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()
        for stored in self.by_digest.keys() & {digest}:  # the dict's own key, found by hash
            # Equal already; confirmed in constant time, so no code path compares key bytes.
            if hmac.compare_digest(stored, digest):
                return self.by_digest[stored]
        return None


def key_digest(key: str) -> str:
    """The hex SHA-256 of `key`, as the key file lists it."""
    return hashlib.sha256(key.encode()).hexdigest()


def bearer(metadata: Iterable[tuple[str, Any]]) -> str | None:
    """The key of an `authorization: Bearer KEY` entry, or None when there is none."""
    for name, value in metadata:
        if name.lower() != "authorization":
            continue
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        scheme, _, key = str(value).strip().partition(" ")
        if scheme.lower() == "bearer" and key.strip():
            return key.strip()
        return None
    return None


class Authenticator:
    """Checks the key of each call against the key file; shared by the gRPC and HTTP edges."""

    def __init__(self, keys_path: str, audit: AuditLog) -> None:
        self.path = keys_path
        self.audit = audit
        self.ring = KeyRing.load(keys_path) if keys_path else None

    @property
    def enabled(self) -> bool:
        return self.ring is not None

    def tenants(self) -> dict[str, TenantPolicy]:
        """Every tenant of the key file and its policy."""
        if self.ring is None:
            return {}
        return {p.tenant: p.policy for p in self.ring.by_digest.values()}

    def reload(self) -> bool:
        """Read the key file again (SIGHUP); a bad file keeps the keys in force."""
        if not self.path:
            return False
        try:
            ring = KeyRing.load(self.path)
        except KeyFileError as exc:
            self.audit.record("keys", "reload_failed", reason=str(exc))
            return False
        self.ring = ring
        self.audit.record("keys", "reloaded", keys=len(ring))
        return True

    def authenticate(self, metadata: Iterable[tuple[str, Any]], peer: str, action: str) -> Principal:
        """The caller whose key `metadata` carries; Unauthenticated without a valid one."""
        ring = self.ring
        if ring is None:
            return ANONYMOUS
        key = bearer(metadata)
        if key is None:
            self.audit.failure("auth", "missing_key", peer=peer, action=action)
            raise Unauthenticated("this call needs an API key: send the header authorization: Bearer KEY")
        principal = ring.lookup(key) if len(key) <= MAX_KEY_CHARS else None
        if principal is None:
            self.audit.failure("auth", "invalid_key", peer=peer, action=action)
            raise Unauthenticated("the API key is not valid")
        return principal

    def require_admin(self, principal: Principal, peer: str, action: str) -> None:
        """PermissionDenied (audited) unless `principal` is an admin."""
        if not principal.is_admin:
            self.audit.failure("admin", "denied", tenant=principal.tenant, peer=peer, action=action)
            raise PermissionDenied(f"{action} needs an admin key")


# ---- which method needs what: the gRPC interceptor -----------------------------------------------

USER_SERVICES = frozenset(
    {
        generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
        models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
        realtime_pb2.DESCRIPTOR.services_by_name["RealtimeService"].full_name,
    }
)
ADMIN_SERVICES = frozenset({cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name})
_MODEL_SERVICE = models_pb2.DESCRIPTOR.services_by_name["ModelService"]
# Full method names (`/package.Service/Method`) of user services that need an admin key; from
# the descriptors, so a renamed method fails at import instead of falling back to "user".
ADMIN_METHODS = frozenset(
    f"/{_MODEL_SERVICE.full_name}/{_MODEL_SERVICE.methods_by_name[name].name}"
    for name in ("LoadModel", "UnloadModel")
)
# The catalog, which workers read too (a worker preloads a model with DescribeModel): an
# admitted worker's token may read it. It holds no tenant's data.
CATALOG_SERVICE = models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name
WORKER = Principal(tenant="", role="worker", key_name="worker token")
# (metadata, auth context) -> whether the caller is an admitted worker
WorkerCheck = Callable[[Iterable[tuple[str, Any]], Mapping[str, Iterable[bytes]]], bool]


def needs(method: str) -> str:
    """'admin', 'user' or '' (open) for a full method name `/package.Service/Method`."""
    service = method.lstrip("/").rpartition("/")[0]
    if service in ADMIN_SERVICES or method in ADMIN_METHODS:
        return "admin"
    if service in USER_SERVICES:
        return "user"
    return ""


class AuthInterceptor(WrappingInterceptor):
    """Authenticates each call of the public services and runs it with `CURRENT` set.

    Place it after the ErrorInterceptor: its refusals are OmniRTErrors that the ErrorInterceptor
    turns into UNAUTHENTICATED / PERMISSION_DENIED with the standard details."""

    def __init__(self, authenticator: Authenticator, worker: WorkerCheck | None = None) -> None:
        super().__init__()
        self.auth = authenticator
        # Is this call from an admitted worker (its token; on the worker port, its certificate)?
        # Such a call may read the catalog.
        self.worker = worker

    def wrap(self, method: str, fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any] | None:
        level = needs(method)
        if not level:
            return None  # open: health, reflection, the worker stream
        catalog = method.startswith(f"/{CATALOG_SERVICE}/") and level != "admin"
        return self._wrap(fn, method.rpartition("/")[2], level == "admin", catalog)

    def _wrap(self, fn: Callable[..., Any], action: str, admin: bool, catalog: bool) -> Callable[..., Any]:
        auth = self.auth
        worker = self.worker if catalog else None

        def enter(context: grpc.aio.ServicerContext) -> Any:
            peer = context.peer()
            metadata = context.invocation_metadata() or ()
            if worker is not None and auth.enabled and worker(metadata, context.auth_context()):
                return CURRENT.set(WORKER)
            principal = auth.authenticate(metadata, peer, action)
            if admin:
                auth.require_admin(principal, peer, action)
                if auth.enabled:
                    auth.audit.record(
                        "admin",
                        "allowed",
                        tenant=principal.tenant,
                        peer=peer,
                        action=action,
                        key=principal.key_name,
                    )
            return CURRENT.set(principal)

        if inspect.isasyncgenfunction(fn):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                token = enter(context)
                try:
                    async for item in fn(request, context):
                        yield item
                finally:
                    # closed from another context when the call's task is ending
                    with contextlib.suppress(ValueError):
                        CURRENT.reset(token)

            return generator

        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = enter(context)
            try:
                return await fn(request, context)
            finally:
                CURRENT.reset(token)

        return coroutine
