"""Large artifacts of the Redis store: written beside Redis, read back, swept after the TTL."""

from __future__ import annotations

import os
import time
from pathlib import Path

from omnirt.controller.engines.redis.artifacts import ArtifactFiles, kept_bytes


def test_an_artifact_over_the_limit_is_a_file_named_after_its_job(tmp_path: Path) -> None:
    files = ArtifactFiles(str(tmp_path), limit_bytes=4, ttl_s=60)
    path = tmp_path / "job-1" / "1"
    fields = files.fields("job-1", {0: b"0123", 1: b"0123456789"})
    assert fields == ["artifact:0", b"0123", "artifact_path:1", str(path)], "at the limit: in the hash"
    assert path.read_bytes() == b"0123456789"
    assert not list(tmp_path.glob("job-1/*.tmp")), "written under a temporary name, then renamed"
    stored = {b"artifact:0": b"0123", b"artifact_path:1": str(path).encode()}  # as Redis gives them
    assert kept_bytes(stored, 0) == b"0123" and kept_bytes(stored, 1) == b"0123456789"
    path.unlink()
    assert kept_bytes(stored, 1) is None and kept_bytes(stored, 2) is None


def test_the_sweep_removes_only_folders_older_than_the_job_ttl(tmp_path: Path) -> None:
    files = ArtifactFiles(str(tmp_path), limit_bytes=4, ttl_s=60)
    old = Path(files.write("job-old", 0, b"x" * 10)).parent
    fresh = Path(files.write("job-new", 0, b"x" * 10)).parent
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    assert files.sweep(time.time()) == 1
    assert not old.exists() and fresh.exists()
    assert ArtifactFiles(str(tmp_path / "missing"), 4, 60).sweep(time.time()) == 0
