"""The daemon helpers the tests use live in the package (`omnirt.testing`)."""

import contextlib
from collections.abc import Iterator
from pathlib import Path

from omnirt.testing import Controller, Daemon, RedisServer, Worker, free_port, wait_for

__all__ = ["Controller", "Daemon", "RedisServer", "Worker", "free_port", "job_store", "wait_for"]


@contextlib.contextmanager
def job_store(kind: str, log_dir: Path) -> Iterator[tuple[str, ...]]:
    """Controller flags for the job store `kind`: "memory", or "redis" (a real redis-server of its own)."""
    if kind == "memory":
        yield ()
        return
    server = RedisServer(log_dir).start()
    try:
        yield ("--store", server.url)
    finally:
        server.stop()
