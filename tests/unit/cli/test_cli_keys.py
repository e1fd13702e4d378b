"""`omnirtctl keys`: a new key works with the controller's key file, tokens are private files."""

from __future__ import annotations

import io
import stat
import sys
from pathlib import Path

import pytest

from omnirt.cli import keys
from omnirt.cli.main import main
from omnirt.controller.edges import auth


def test_a_new_key_is_printed_once_and_its_entry_loads_in_the_controller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    assert main(["keys", "new", "--tenant", "alice", "--max-queued", "5", "--file", str(path)]) == 0
    first = capsys.readouterr().out.strip()
    assert main(["keys", "new", "--tenant", "alice", "--file", str(path)]) == 0  # a rotation
    second = capsys.readouterr().out.strip()
    assert main(["keys", "new", "--tenant", "ops", "--role", "admin", "--file", str(path)]) == 0
    admin = capsys.readouterr().out.strip()
    text = path.read_text()
    assert first not in text and second not in text, "keys are never written in clear"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = auth.KeyRing.load(str(path))
    for key in (first, second):
        found = ring.lookup(key)
        assert found is not None and found.tenant == "alice" and found.policy.max_queued == 5
    found = ring.lookup(admin)
    assert found is not None and found.is_admin
    assert len({first, second, admin}) == 3 and all(len(k) > 40 for k in (first, second, admin))


def test_a_bad_tenant_is_refused_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "keys.toml"
    assert main(["keys", "new", "--tenant", "a b", "--file", str(path)]) == 2
    assert "--tenant" in capsys.readouterr().err
    assert not path.exists()


def test_the_cli_and_the_controller_agree_on_tenant_names() -> None:
    assert keys.TENANT_RE.pattern == auth.TENANT_RE.pattern


def test_token_and_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    assert main(["keys", "token", str(token)]) == 0
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text().strip()) > 40
    monkeypatch.setattr(sys, "stdin", io.StringIO("abc\n"))
    assert main(["keys", "hash"]) == 0
    assert capsys.readouterr().out.strip() == auth.key_digest("abc")
