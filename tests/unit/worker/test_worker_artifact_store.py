"""The worker's side of the artifact store without a server: it uploads only to the store the
controller names, and a store it cannot reach (a closed loopback port) leaves the bytes in the
result with a warning in the report, so the job still ends with its outputs."""

from __future__ import annotations

import asyncio

import pytest

from omnirt import types as t
from omnirt.testing import free_port
from omnirt.worker.artifact_store import ArtifactUploader
from omnirt.worker.config import WorkerConfig


def result() -> t.GenerateResult:
    artifacts = [
        t.Artifact(
            index=i, kind=t.MediaKind.IMAGE, mime_type="image/png", data=b"png%d" % i, file_name=f"{i}.png"
        )
        for i in range(2)
    ]
    return t.GenerateResult(job_id="job-1", artifacts=artifacts)


@pytest.fixture
def uploader(monkeypatch: pytest.MonkeyPatch) -> ArtifactUploader:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    config = WorkerConfig(artifact_store="s3://bucket/arts/", artifact_store_endpoint=closed)
    return ArtifactUploader(config)


def test_a_worker_uploads_only_to_the_controllers_store(uploader: ArtifactUploader) -> None:
    assert not uploader.active  # not welcomed yet
    for named in ("", "s3://bucket/other", "s3://other/arts"):
        uploader.welcomed(named)
        assert not uploader.active
        kept = result()
        asyncio.run(uploader.offload("job-1", kept))
        assert [a.data for a in kept.artifacts] == [b"png0", b"png1"] and not kept.report.warnings
    uploader.welcomed("s3://bucket/arts")  # the same store, written without the trailing '/'
    assert uploader.active


def test_an_unreachable_store_leaves_the_bytes_and_says_so(uploader: ArtifactUploader) -> None:
    uploader.welcomed("s3://bucket/arts")
    kept = result()
    asyncio.run(uploader.offload("job-1", kept))
    assert [a.data for a in kept.artifacts] == [b"png0", b"png1"]
    assert all(not a.object_uri for a in kept.artifacts)
    [warning] = kept.report.warnings
    assert warning.startswith("artifact store s3://bucket/arts unreachable (EndpointConnectionError")
    assert warning.endswith("artifact(s) 0, 1 went through the controller instead")
