"""Large artifacts of the Redis store: written beside Redis, read back, swept after the TTL."""

from __future__ import annotations

import os
import time
from pathlib import Path

from omnirt.controller.engines.redis.store import RedisJobStore


def make_store(folder: Path, ttl_s: float = 60) -> RedisJobStore:
    # No command is sent: the client connects lazily, and these tests only touch the folder.
    return RedisJobStore(
        "redis://127.0.0.1:1/0",
        job_ttl_s=ttl_s,
        idempotency_ttl_s=60,
        artifact_limit_bytes=4,
        artifact_dir=str(folder),
    )


def test_an_artifact_over_the_limit_is_a_file_named_after_its_job(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    path = Path(store._write_artifact("job-1", 0, b"0123456789"))
    assert path == tmp_path / "job-1" / "0"
    assert path.read_bytes() == b"0123456789"
    assert not list(tmp_path.glob("job-1/*.tmp")), "written under a temporary name, then renamed"


def test_the_sweep_removes_only_folders_older_than_the_job_ttl(tmp_path: Path) -> None:
    store = make_store(tmp_path, ttl_s=60)
    old = Path(store._write_artifact("job-old", 0, b"x" * 10)).parent
    fresh = Path(store._write_artifact("job-new", 0, b"x" * 10)).parent
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert store.sweep_artifacts(time.time()) == 1
    assert not old.exists() and fresh.exists()
    assert make_store(tmp_path / "missing").sweep_artifacts(time.time()) == 0
