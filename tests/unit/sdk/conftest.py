from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from sdk_fake_server import FakeController, start


@pytest.fixture
def fake() -> Iterator[FakeController]:
    """A scripted omnirt.v1 server on a free loopback port."""
    controller = FakeController()
    server = start(controller)
    yield controller
    server.stop(grace=None)
