"""The asyncio client of the OmniRT controller: `Client`'s methods, awaited, over `grpc.aio`.

Each method runs the same plan as `omnirt.Client`'s (`omnirt._internal.calls`) on the same
channel settings (`omnirt._internal.channel`); this module only makes the awaited calls. A test
holds the two clients to the same public methods and parameters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Unpack

import grpc
import grpc.aio

from omnirt import errors
from omnirt._internal import calls
from omnirt._internal.calls import CancelResult
from omnirt._internal.channel import ChannelSettings, Metadata, PathArg, open_aio_channel
from omnirt._internal.requests import Media, RequestFields
from omnirt.session import AsyncRealtimeSession, session_open
from omnirt.types import (
    GenerateRequest,
    GenerateResult,
    Job,
    JobEvent,
    JobState,
    ModelOutcome,
    ModelSpec,
    SessionInfo,
    Task,
    ValidationResult,
    WorkerInfo,
)
from omnirt.v1 import cluster_pb2_grpc, generation_pb2_grpc, models_pb2_grpc, realtime_pb2_grpc

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient:
    """An asyncio connection to one controller; the same methods as `omnirt.Client`, awaited.

    Create it inside a running event loop, and close it with `await client.close()` or
    `async with AsyncClient() as client:`. `watch` is an async iterator. The arguments (the
    address, TLS with `tls`, `ca`, `cert`, `key`, `$OMNIRT_TLS_CA`, and the API key with
    `api_key`, `$OMNIRT_API_KEY`) work as for `omnirt.Client`.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        timeout: float | None = None,
        metadata: Metadata = (),
        options: Sequence[tuple[str, Any]] = (),
        credentials: grpc.ChannelCredentials | None = None,
        tls: bool | None = None,
        ca: PathArg | None = None,
        cert: PathArg | None = None,
        key: PathArg | None = None,
        api_key: str | None = None,
        retries: int = calls.RETRIES,
    ) -> None:
        settings = ChannelSettings.of(
            address, options=options, credentials=credentials, tls=tls, ca=ca, cert=cert, key=key,
            api_key=api_key,
        )  # fmt: skip
        self.address = settings.address
        self.timeout = timeout
        self.retries = retries
        self.metadata = tuple(metadata)
        self.tls = settings.credentials is not None
        self.channel = open_aio_channel(settings)
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.models = models_pb2_grpc.ModelServiceStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)
        self.realtime = realtime_pb2_grpc.RealtimeServiceStub(self.channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self.channel.close(None)

    def __repr__(self) -> str:
        return f"AsyncClient({self.address!r}{', tls=True' if self.tls else ''})"  # never the key

    # ---- the awaited I/O under `omnirt._internal.calls` ----------------------------------

    async def _run(self, plan: calls.Plan[T]) -> T:
        return await calls.run_async(plan, self._perform, self.retries)

    async def _perform(self, step: calls.Step) -> Any:
        """One step of a plan: a unary call, a stream followed to its end, or a pause."""
        if isinstance(step, calls.Unary):
            method = getattr(getattr(self, step.service), step.method)
            try:
                return await method(
                    step.request, timeout=step.timeout or self.timeout, metadata=self.metadata
                )
            except grpc.RpcError as exc:
                raise errors.map_rpc_error(exc, self.address) from None
        if isinstance(step, calls.Follow):
            items = self._items(step.stream)
            async with contextlib.aclosing(items):
                async for item in items:
                    if step.each(item):
                        break
            return None
        await asyncio.sleep(step.seconds)
        return None

    async def _items(self, stream: calls.Stream[T]) -> AsyncGenerator[T, None]:
        method = getattr(getattr(self, stream.service), stream.method)
        call = method(stream.request, timeout=stream.timeout, metadata=self.metadata)
        try:
            async for message in call:
                yield stream.parse(message)
        except grpc.RpcError as exc:
            raise errors.map_rpc_error(exc, self.address) from None
        finally:
            call.cancel()  # a no-op once the stream ended; stops it when the caller breaks off

    # ---- realtime sessions ---------------------------------------------------------------

    async def open_session(
        self,
        model: str,
        *,
        image: Media | None = None,
        video_encoding: str = "",
        fps: float = 0.0,
        width: int = 0,
        height: int = 0,
        sample_rate: int = 0,
        idle_timeout_ms: int = 0,
        labels: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> AsyncRealtimeSession:
        """Open a realtime session of streaming `model`; returns once it is ready.

        `image` is its reference portrait (bytes or a path); see `omnirt.session`.
        """
        opened = session_open(
            model, image, video_encoding=video_encoding, fps=fps, width=width, height=height,
            sample_rate=sample_rate, idle_timeout_ms=idle_timeout_ms, labels=labels, config=config,
        )  # fmt: skip
        return await AsyncRealtimeSession(self.realtime, self.metadata, self.address).start(opened)

    # ---- generation ----------------------------------------------------------------------

    async def generate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> GenerateResult:
        """Run one generation and wait for its result; `timeout` (s) is the call's deadline."""
        return await self._run(calls.generate(request, timeout, fields))

    async def submit(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> Job:
        """Queue a generation and return its job at once (see `wait` and `watch`)."""
        return await self._run(calls.submit(request, timeout, fields))

    async def validate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> ValidationResult:
        """Resolve a request into its execution plan without running it."""
        return await self._run(calls.validate(request, timeout, fields))

    # ---- jobs ----------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Job:
        """The job as it stands now."""
        return await self._run(calls.get_job(job_id))

    async def list_jobs(
        self, states: Sequence[JobState | str] | None = None, model: str = "", limit: int = 0
    ) -> list[Job]:
        """Jobs, newest first, optionally only in `states` or of `model`; at most `limit` (0: all)."""
        return await self._run(calls.list_jobs(states, model, limit))

    def watch(
        self, job_id: str, after_sequence: int = 0, *, timeout: float | None = None
    ) -> AsyncIterator[JobEvent]:
        """The job's events from the start (or after `after_sequence`) until the server ends the stream."""
        return self._items(calls.watch(job_id, after_sequence, timeout))

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel a queued or running job; the result's `cancelled` is False if it had already ended."""
        return await self._run(calls.cancel(job_id))

    async def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> GenerateResult:
        """Follow a job to its end and return its result (see `Client.wait`)."""
        return await self._run(calls.wait(job_id, timeout, on_event))

    async def download_artifact(self, job_id: str, index: int, *, timeout: float | None = None) -> bytes:
        """The bytes of artifact `index` of a finished job, streamed in chunks."""
        return await self._run(calls.download_artifact(job_id, index, timeout))

    async def save(self, result: GenerateResult, folder: str | os.PathLike[str]) -> list[Path]:
        """Write every artifact into `folder` under its file name, downloading those not inline."""
        return await self._run(calls.save(result, folder))

    # ---- catalog and cluster -------------------------------------------------------------

    async def list_models(self, task: Task | str | None = None) -> list[ModelSpec]:
        """Catalog entries, optionally only those that do `task`."""
        return await self._run(calls.list_models(task))

    async def describe_model(self, name: str) -> ModelSpec:
        """One catalog entry by id or alias."""
        return await self._run(calls.describe_model(name))

    async def load_model(
        self,
        model: str,
        *,
        workers: int = 0,
        worker_ids: Sequence[str] = (),
        timeout: float | None = None,
    ) -> list[ModelOutcome]:
        """Make `model` warm on `workers` workers that can serve it and wait for the loads (see `Client`)."""
        return await self._run(calls.load_model(model, workers, worker_ids, timeout))

    async def unload_model(
        self, model: str, *, worker_ids: Sequence[str] = (), timeout: float | None = None
    ) -> list[ModelOutcome]:
        """Free `model` on `worker_ids` (empty: every worker that serves it; see `Client`)."""
        return await self._run(calls.unload_model(model, worker_ids, timeout))

    async def list_workers(self) -> list[WorkerInfo]:
        """The workers connected to the controller."""
        return await self._run(calls.list_workers())

    async def list_sessions(self, model: str = "") -> list[SessionInfo]:
        """The realtime sessions open now (of `model`); an admin key with auth on."""
        return await self._run(calls.list_sessions(model))

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        """Let a worker finish what it runs, give it nothing new, and stop it."""
        return await self._run(calls.drain_worker(worker_id))

    async def webhook_secret(self, tenant: str = "") -> str:
        """The `whsec_...` secret that signs this caller's webhooks (another tenant's: admins only)."""
        return await self._run(calls.webhook_secret(tenant))
