"""Fixtures the integration tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import RedisServer


@pytest.fixture(scope="module")
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free port for the module's tests (each test uses its own key
    prefix); a module that needs a fresh server per test defines its own fixture."""
    server = RedisServer(log_dir).start()
    yield server
    server.stop()
