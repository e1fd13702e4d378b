"""The bytes of a result's artifacts that the client's view leaves out, kept beside the job.

Up to `--store-artifact-limit-bytes` an artifact's bytes live in the job's hash
(`artifact:INDEX`); a larger one is a file in `--artifact-dir`, which every controller of one
Redis should share (a controller reads only the files it can see), and the hash keeps its path
(`artifact_path:INDEX`). A job's folder is swept once the job has expired.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omnirt.errors import FailedPrecondition
from omnirt.types import Artifact


class ArtifactFiles:
    """Where `RedisJobStore` puts the bytes of artifacts cut from a result's view."""

    def __init__(self, folder: str, limit_bytes: int, ttl_s: int) -> None:
        self.folder = Path(folder or os.path.join(tempfile.gettempdir(), "omnirt-artifacts"))
        self.limit_bytes = limit_bytes
        self.ttl_s = ttl_s

    def fields(self, job_id: str, artifacts: Mapping[int, bytes]) -> list[Any]:
        """The job hash's fields and values for `artifacts` (index -> bytes): the bytes of a
        small one, the path of a large one (written now)."""
        fields: list[Any] = []
        for index, data in artifacts.items():
            if len(data) <= self.limit_bytes:
                fields += [f"artifact:{index}", data]
            else:
                fields += [f"artifact_path:{index}", self.write(job_id, index, data)]
        return fields

    def write(self, job_id: str, index: int, data: bytes) -> str:
        """Write one artifact's file (under a temporary name, then renamed); its path."""
        folder = self.folder / job_id
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / str(index)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
        return str(path)

    def data_of(self, job_id: str, fields: Mapping[bytes, bytes], index: int, artifact: Artifact) -> bytes:
        """The bytes of artifact `index` of the job whose hash is `fields`: kept beside the job,
        else `artifact`'s own (inline; none for an artifact-store object, which the edge streams
        from that store). FailedPrecondition when they were kept in a file this controller cannot
        see."""
        data = kept_bytes(fields, index)
        if data is not None:
            return data
        if not artifact.data and artifact.size_bytes and not artifact.object_uri:
            raise FailedPrecondition(
                f"the bytes of artifact {index} of job {job_id} are gone (artifact dir "
                f"{self.folder} not shared with the controller that stored them?)"
            )
        return artifact.data

    def sweep(self, now: float) -> int:
        """Delete the folders older than the job TTL (their jobs expired); how many."""
        if not self.folder.is_dir():
            return 0
        removed = 0
        for folder in self.folder.iterdir():
            try:
                if now - folder.stat().st_mtime > self.ttl_s:
                    shutil.rmtree(folder)
                    removed += 1
            except OSError:
                continue  # another controller removed it first
        return removed


def kept_bytes(fields: Mapping[bytes, bytes], index: int) -> bytes | None:
    """The bytes a job's hash (`fields`) keeps for artifact `index`, or None (none kept, or the
    file is gone or not on this controller's disk)."""
    data = fields.get(f"artifact:{index}".encode())
    if data is not None:
        return data
    path = fields.get(f"artifact_path:{index}".encode())
    if path is None:
        return None
    try:
        return Path(path.decode()).read_bytes()
    except OSError:
        return None
