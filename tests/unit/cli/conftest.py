from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The scripted server lives beside the SDK's tests.
sys.path.insert(0, str(Path(__file__).parents[1] / "sdk"))

from sdk_fake_server import FakeController, start


@pytest.fixture
def fake() -> Iterator[FakeController]:
    """A scripted omnirt.v1 server on a free loopback port."""
    controller = FakeController()
    server = start(controller)
    yield controller
    server.stop(grace=None)


@pytest.fixture(autouse=True)
def _no_controller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMNIRT_CONTROLLER", raising=False)
