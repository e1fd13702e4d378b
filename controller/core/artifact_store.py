"""The controller's side of the S3-compatible artifact store (`--artifact-store s3://...`).

Workers configured with the same store upload their outputs and send only references
(`Artifact.object_uri`); the controller checks each reference names an object of that job in
its store, gives clients a presigned GET URL (valid `--artifact-url-ttl-s`, never past the job's
TTL), streams the object for DownloadArtifact and the HTTP download route, and deletes the
objects of expired jobs: at once when the memory engine evicts a job, and by a sweep of the
objects older than the job TTL (every `--artifact-store-sweep-s`), which also covers the Redis
engine, several controllers and objects of results that never landed. A bucket lifecycle rule
is the operator's safety net (docs/artifacts.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from omnirt._internal.object_store import ObjectStore, StoreSettings, failure_reason
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.engine_client import EngineClient
from omnirt.errors import Unavailable

log = logging.getLogger("omnirt.controller.artifacts")
# The sweep spares objects this much longer than the job TTL: S3's LastModified is in whole
# seconds, and an upload precedes its job's finish (the start of the TTL) by the result's trip.
SWEEP_GRACE_S = 2.0


class ArtifactStore:
    """One controller's view of the store: references, presigned URLs, reads and deletes."""

    def __init__(self, config: ControllerConfig) -> None:
        settings = StoreSettings.of(
            config.artifact_store, config.artifact_store_endpoint, config.artifact_store_region
        )
        self.location = settings.location
        self.store = ObjectStore(settings)
        # Presigned URLs never outlive the job (nor S3's own 7-day limit on SigV4 URLs).
        self.url_ttl_s = int(min(config.artifact_url_ttl_s, config.job_ttl_s, 7 * 86400))
        self.job_ttl_s = config.job_ttl_s
        self.sweep_s = config.artifact_store_sweep_s
        # Jobs with objects whose eviction this controller hears of (memory engine); a job is
        # dropped from here when its objects are deleted.
        self.track_evictions = False
        self._stored: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def __str__(self) -> str:
        return str(self.location)

    def reference(self, job_id: str, object_uri: str) -> tuple[str, str, int]:
        """The key, presigned URL and URL expiry (epoch ms) of a worker's reference (ValueError
        when it is not an object of this job in this store). The URL is "" when it cannot be
        signed (no credentials): DownloadArtifact still serves the object."""
        key = self.location.job_key(object_uri, job_id)
        if key is None:
            raise ValueError(
                f"artifact reference {object_uri[:200]!r} is not an object of job {job_id} in {self}"
            )
        if self.track_evictions:
            self._stored.add(job_id)
        if self.url_ttl_s <= 0:
            return key, "", 0
        try:  # signing is local (no request to the store): cheap on the event loop
            url = self.store.presign(key, self.url_ttl_s)
        except Exception as exc:
            log.warning("cannot presign %s: %s", object_uri, exc)
            return key, "", 0
        return key, url, int(time.time() * 1000) + self.url_ttl_s * 1000

    def key_of(self, job_id: str, object_uri: str) -> str:
        """The key of an accepted reference (checked again: it came from a job record)."""
        key = self.location.job_key(object_uri, job_id)
        if key is None:
            raise Unavailable(f"artifact {object_uri[:200]!r} is not in this controller's store {self}")
        return key

    async def chunks(self, job_id: str, object_uri: str) -> AsyncIterator[bytes]:
        """The object's bytes in chunks, read in a thread (Unavailable when the store fails)."""
        key = self.key_of(job_id, object_uri)
        try:
            body = await asyncio.to_thread(self.store.read, key)
        except Exception as exc:
            raise Unavailable(
                f"artifact store {self} cannot serve {object_uri}: {failure_reason(exc)}"
            ) from None
        try:
            while True:
                try:
                    chunk = await asyncio.to_thread(next, body, b"")
                except Exception as exc:  # the store went away mid-object
                    raise Unavailable(
                        f"artifact store {self} failed reading {object_uri}: {failure_reason(exc)}"
                    ) from None
                if not chunk:
                    return
                yield chunk
        finally:  # also when the client went away mid-object: the connection goes back
            body.close()

    # ---- lifecycle ----------------------------------------------------------------------

    def forget(self, job_id: str) -> None:
        """The memory engine evicted `job_id`: delete its objects (in the background)."""
        if job_id in self._stored:
            self._stored.discard(job_id)
            self._spawn(self._delete_job(job_id))

    def start(self) -> None:
        """Start the sweep of expired objects."""
        if self.sweep_s > 0 and self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop())

    async def stop(self) -> None:
        """Stop the sweep and let pending deletes end."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # evicted outside the loop (tools, tests): the sweep deletes them
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_job(self, job_id: str) -> None:
        try:
            deleted = await asyncio.to_thread(self.store.delete_job, job_id)
            log.debug("deleted %d object(s) of expired job %s", deleted, job_id)
        except Exception as exc:
            log.warning("cannot delete the objects of job %s from %s: %s", job_id, self, failure_reason(exc))

    async def _sweep_loop(self) -> None:
        while True:
            try:
                deleted = await asyncio.to_thread(self.store.delete_expired, self.job_ttl_s + SWEEP_GRACE_S)
                if deleted:
                    log.info("deleted %d expired object(s) from %s", deleted, self)
            except Exception as exc:
                log.warning("artifact store %s sweep failed: %s", self, failure_reason(exc))
            await asyncio.sleep(self.sweep_s)


def object_chunks(store: ArtifactStore | None, job_id: str, object_uri: str) -> AsyncIterator[bytes]:
    """The chunks of an artifact that lives in the store (Unavailable when this controller has
    no store: the message says where the artifact is)."""
    if store is None:
        raise Unavailable(f"artifact {object_uri[:200]} is in an object store this controller does not use")
    return store.chunks(job_id, object_uri)


async def artifact_bytes(
    engine: EngineClient, store: ArtifactStore | None, job_id: str, index: int, tenant: str | None
) -> bytes:
    """The whole bytes of one artifact, wherever they live (tenant-checked by the engine)."""
    data, result = await engine.artifact(job_id, index, tenant=tenant)
    artifact = result.artifacts[index]
    if data or not artifact.object_uri:
        return data
    return b"".join([chunk async for chunk in object_chunks(store, job_id, artifact.object_uri)])
