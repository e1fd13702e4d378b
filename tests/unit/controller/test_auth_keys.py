"""The key file: what it accepts, what it refuses (naming the entry), and how a key is found."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnirt.controller.core.tenants import TenantPolicy
from omnirt.controller.edges.audit import AuditLog
from omnirt.controller.edges.auth import (
    ANONYMOUS,
    CURRENT,
    Authenticator,
    KeyFileError,
    KeyRing,
    bearer,
    caller,
    key_digest,
)
from omnirt.errors import PermissionDenied, Unauthenticated


def entry(tenant: str, key: str, **fields: object) -> str:
    lines = ["[[keys]]", f'tenant = "{tenant}"', f'sha256 = "{key_digest(key)}"']
    for k, v in fields.items():
        value = f'"{v}"' if isinstance(v, str) else str(v).lower()  # True -> true, inf -> inf
        lines.append(f"{k} = {value}")
    return "\n".join(lines) + "\n"


def test_a_key_is_found_by_its_digest_and_carries_tenant_role_and_quotas() -> None:
    ring = KeyRing.parse(
        entry("alice", "k1", max_queued=5, rate_per_s=2.5) + entry("ops", "k2", role="admin")
    )
    alice, ops = ring.lookup("k1"), ring.lookup("k2")
    assert alice is not None and alice.tenant == "alice" and alice.role == "user" and not alice.is_admin
    assert alice.policy == TenantPolicy(max_queued=5, rate_per_s=2.5)
    assert alice.scope == "alice"
    assert ops is not None and ops.is_admin and ops.scope is None
    assert ring.lookup("k3") is None and ring.lookup("") is None
    assert ring.lookup(key_digest("k1")) is None, "the digest itself is not a key"


def test_a_rotated_key_without_quotas_has_its_tenants_quotas() -> None:
    ring = KeyRing.parse(entry("alice", "old") + entry("alice", "new", max_queued=3, weight=2))
    for key in ("old", "new"):
        found = ring.lookup(key)
        assert found is not None and found.policy == TenantPolicy(max_queued=3, weight=2.0)


@pytest.mark.parametrize(
    "text, says",
    [
        (
            entry("alice", "a", max_queued=1) + entry("alice", "b", max_queued=2),
            "key 2: tenant 'alice' has other quotas in",
        ),
        (entry("alice", "a") + entry("bob", "a"), "key 2: the same key is listed twice"),
        (entry("alice", "a", weight=0), "key 1: weight must be > 0"),
        (entry("alice", "a", rate_per_s=float("inf")), "key 1: rate_per_s must be a number >= 0"),
        (entry("alice", "a", burst=1.5), "key 1: burst must be an integer >= 0"),
        (entry("alice", "a", max_queued=True), "key 1: max_queued must be an integer >= 0"),
        (entry("alice", "a", colour="red"), "key 1: unknown field 'colour'"),
        (entry("x" * 65, "a"), "key 1: tenant must be"),
        ("[[keys]]\ntenant = 'a'\n", "key 1: sha256 must be 64 hex digits"),
    ],
)
def test_a_bad_key_file_names_the_entry(text: str, says: str) -> None:
    with pytest.raises(KeyFileError, match=r"keys\.toml") as info:
        KeyRing.parse(text, "keys.toml")
    assert says in str(info.value)


@pytest.mark.parametrize(
    "metadata, key",
    [
        ((("authorization", "Bearer abc"),), "abc"),
        ((("Authorization", "bearer  abc "),), "abc"),
        ((("authorization", b"Bearer abc"),), "abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer"),), None),
        ((("x-api-key", "abc"),), None),
        ((), None),
    ],
)
def test_bearer(metadata: tuple[tuple[str, object], ...], key: str | None) -> None:
    assert bearer(metadata) == key


def test_authenticator_refuses_and_audits_without_the_key(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(entry("alice", "right"))
    log = tmp_path / "audit.log"
    auth = Authenticator(str(keys), AuditLog(str(log)))
    assert (
        auth.authenticate((("authorization", "Bearer right"),), "ipv4:1.2.3.4:5", "GetJob").tenant == "alice"
    )
    with pytest.raises(Unauthenticated, match="needs an API key"):
        auth.authenticate((), "ipv4:1.2.3.4:5", "GetJob")
    with pytest.raises(Unauthenticated, match="not valid"):
        auth.authenticate((("authorization", "Bearer wrong-secret"),), "ipv4:1.2.3.4:5", "GetJob")
    with pytest.raises(Unauthenticated):
        auth.authenticate((("authorization", "Bearer " + "x" * 5000),), "p", "GetJob")
    user = auth.authenticate((("authorization", "Bearer right"),), "p", "DrainWorker")
    with pytest.raises(PermissionDenied, match="DrainWorker needs an admin key"):
        auth.require_admin(user, "p", "DrainWorker")
    text = log.read_text()
    assert "wrong-secret" not in text and '"right"' not in text
    assert '"outcome": "missing_key"' in text and '"outcome": "invalid_key"' in text and '"denied"' in text


def test_reload_keeps_the_keys_in_force_when_the_new_file_is_bad(tmp_path: Path) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(entry("alice", "one"))
    auth = Authenticator(str(keys), AuditLog(str(tmp_path / "audit.log")))
    keys.write_text("[[keys]\n")
    assert not auth.reload()
    assert auth.authenticate((("authorization", "Bearer one"),), "p", "a").tenant == "alice"
    keys.write_text(entry("bob", "two"))
    assert auth.reload()
    assert auth.authenticate((("authorization", "Bearer two"),), "p", "a").tenant == "bob"
    with pytest.raises(Unauthenticated):
        auth.authenticate((("authorization", "Bearer one"),), "p", "a")


def test_without_a_key_file_everyone_is_the_anonymous_admin_and_unset_fails_closed() -> None:
    auth = Authenticator("", AuditLog())
    assert auth.authenticate((), "p", "a") is ANONYMOUS
    with pytest.raises(Unauthenticated):
        caller()  # nothing set CURRENT: a path that skipped authentication is refused
    token = CURRENT.set(ANONYMOUS)
    try:
        assert caller() is ANONYMOUS
    finally:
        CURRENT.reset(token)
