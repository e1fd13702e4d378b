"""Uploading a job's outputs to the S3-compatible artifact store (`--artifact-store`).

The worker uploads only when the controller uses the very same store (its Welcome says which):
then a result carries each artifact's `object_uri` and metadata (size, sha256, MIME type) and no
bytes, so a large video never crosses the controller. When the store cannot be reached the job
still ends: the artifacts not uploaded keep their bytes and go through the controller as they
would without a store, and the run report's warnings say so and why.
"""

from __future__ import annotations

import asyncio
import logging

from omnirt._internal.object_store import ObjectStore, StoreSettings, failure_reason
from omnirt.types import GenerateResult
from omnirt.worker.config import WorkerConfig

log = logging.getLogger("omnirt.worker.artifacts")


class ArtifactUploader:
    """The worker's side of the artifact store: offloads results while the controller agrees."""

    def __init__(self, config: WorkerConfig) -> None:
        settings = StoreSettings.of(
            config.artifact_store,
            config.artifact_store_endpoint,
            config.artifact_store_region,
            config.artifact_store_multipart_threshold_bytes,
        )
        self.location = settings.location
        self.store = ObjectStore(settings)
        # What the controller's Welcome said; uploads happen only while it is this store.
        self.controller_store = ""

    @property
    def active(self) -> bool:
        """True while the controller serves artifacts from this very store."""
        return self.controller_store == str(self.location)

    def welcomed(self, controller_store: str) -> None:
        """Note the store of the controller that just welcomed this worker."""
        self.controller_store = controller_store
        if not self.active:
            log.warning(
                "artifact store %s not used: the controller's is %s; outputs go through the controller",
                self.location,
                controller_store or "none",
            )

    async def offload(self, job_id: str, result: GenerateResult) -> None:
        """Upload the result's artifacts and replace their bytes by `object_uri` (in place).

        On the first failure the rest keep their bytes too (the store is likely down: one
        timeout, not one per artifact), and a warning goes into the run report."""
        if not self.active:
            return
        pending = [a for a in result.artifacts if a.data and not a.object_uri]
        for n, artifact in enumerate(pending):
            key = self.location.key(job_id, artifact.index, artifact.file_name)
            try:
                await asyncio.to_thread(self.store.upload, key, artifact.data, artifact.mime_type)
            except Exception as exc:  # any store failure: the bytes take the stream instead
                reason = failure_reason(exc)
                log.warning("artifact store %s failed for job %s: %s", self.location, job_id, reason)
                indexes = ", ".join(str(a.index) for a in pending[n:])
                if result.report is not None:
                    result.report.warnings.append(
                        f"artifact store {self.location} unreachable ({reason}); "
                        f"artifact(s) {indexes} went through the controller instead"
                    )
                return
            artifact.size_bytes = artifact.size_bytes or len(artifact.data)
            artifact.object_uri = self.location.uri(key)
            artifact.data = b""
