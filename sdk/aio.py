"""The asyncio client of the OmniRT controller: `Client`'s methods over `grpc.aio`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Unpack

import grpc
import grpc.aio

from omnirt import errors
from omnirt._internal import convert as conv
from omnirt.client import (
    CancelResult,
    JobFollower,
    Metadata,
    PathArg,
    RequestFields,
    api_key_or_env,
    artifact_file_name,
    bearer_entry,
    build_request,
    channel_credentials,
    channel_options,
    default_address,
    map_rpc_error,
    parse_state,
    parse_task,
    remaining,
    validation_from_proto,
    wait_timed_out,
)
from omnirt.session import AsyncRealtimeSession, session_open
from omnirt.types import (
    GenerateRequest,
    GenerateResult,
    Job,
    JobEvent,
    JobState,
    ModelOutcome,
    ModelSpec,
    Task,
    ValidationResult,
    WorkerInfo,
)
from omnirt.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
    realtime_pb2_grpc,
)

__all__ = ["AsyncClient"]


class _BearerKey:
    """Adds `authorization: Bearer KEY` to a call's metadata (see `omnirt.client.BearerKeyInterceptor`)."""

    def __init__(self, api_key: str) -> None:
        self._entry = bearer_entry(api_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<key>)"

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._entry)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files an interceptor under the first call kind it implements: one class per kind.
class _UnaryUnaryKey(_BearerKey, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStreamKey(_BearerKey, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnaryKey(_BearerKey, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStreamKey(_BearerKey, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def key_interceptors(api_key: str) -> list[Any]:
    """The interceptors that send `api_key` with every call of a grpc.aio channel (none without one)."""
    if not api_key:
        return []
    return [kind(api_key) for kind in (_UnaryUnaryKey, _UnaryStreamKey, _StreamUnaryKey, _StreamStreamKey)]


class AsyncClient:
    """An asyncio connection to one controller; the same methods as `omnirt.Client`, awaited.

    Create it inside a running event loop, and close it with `await client.close()` or
    `async with AsyncClient() as client:`. `watch` is an async iterator. TLS (`tls`, `ca`,
    `cert`, `key`, `$OMNIRT_TLS_CA`) and the API key (`api_key`, `$OMNIRT_API_KEY`) work as
    for `omnirt.Client`.
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
    ) -> None:
        self.address = address or default_address()
        self.timeout = timeout
        self.metadata = tuple(metadata)
        opts = channel_options(options)
        if credentials is not None and (tls or ca is not None or cert is not None):
            raise ValueError("give credentials= or tls=/ca=/cert=/key=, not both")
        if credentials is None:
            credentials = channel_credentials(tls, ca, cert, key)
        self.tls = credentials is not None
        interceptors = key_interceptors(api_key_or_env(api_key))
        if credentials is None:
            self.channel = grpc.aio.insecure_channel(self.address, options=opts, interceptors=interceptors)
        else:
            self.channel = grpc.aio.secure_channel(
                self.address, credentials, options=opts, interceptors=interceptors
            )
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.models = models_pb2_grpc.ModelServiceStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)
        self.realtime = realtime_pb2_grpc.RealtimeServiceStub(self.channel)

    async def open_session(
        self,
        model: str,
        *,
        image: bytes | None = None,
        labels: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> AsyncRealtimeSession:
        """Open a realtime session of streaming `model`; returns once it is ready.

        `image`: its portrait (bytes). `fields`: video_encoding, fps, width, height,
        sample_rate, idle_timeout_ms, as `Client.open_session`.
        """
        opened = session_open(model, image, labels=labels, config=config, **fields)
        return await AsyncRealtimeSession(self.realtime, self.metadata, self.address).start(opened)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        await self.channel.close(None)

    def __repr__(self) -> str:
        return f"AsyncClient({self.address!r}{', tls=True' if self.tls else ''})"  # never the key

    async def _call(self, method: Any, message: Any, timeout: float | None = None) -> Any:
        try:
            return await method(message, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address) from None

    async def _stream(self, method: Any, message: Any, timeout: float | None) -> AsyncGenerator[Any, None]:
        call = method(message, timeout=timeout, metadata=self.metadata)
        try:
            async for item in call:
                yield item
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address) from None
        finally:
            call.cancel()

    # ---- generation ----------------------------------------------------------------------

    async def generate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> GenerateResult:
        """Run one generation and wait for its result; `timeout` (s) is the call's deadline."""
        req = build_request(request, **fields)
        resp = await self._call(self.generation.Generate, conv.request_to_proto(req), timeout)
        if resp.HasField("result"):
            return conv.result_from_proto(resp.result)
        job = conv.job_from_proto(resp.job)
        return JobFollower(job.id).outcome(job)

    async def submit(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> Job:
        """Queue a generation and return its job at once."""
        req = build_request(request, **fields)
        message = generation_pb2.SubmitRequest(request=conv.request_to_proto(req))
        return conv.job_from_proto((await self._call(self.generation.Submit, message, timeout)).job)

    async def validate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> ValidationResult:
        """Resolve a request into its execution plan without running it."""
        req = build_request(request, **fields)
        message = generation_pb2.ValidateRequest(request=conv.request_to_proto(req))
        return validation_from_proto(await self._call(self.generation.Validate, message, timeout))

    # ---- jobs ----------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Job:
        """The job as it stands now."""
        resp = await self._call(self.generation.GetJob, generation_pb2.GetJobRequest(job_id=job_id))
        return conv.job_from_proto(resp.job)

    async def list_jobs(
        self, states: Sequence[JobState | str] | None = None, model: str = "", limit: int = 0
    ) -> list[Job]:
        """Jobs, newest first, optionally only in `states` or of `model`; at most `limit` (0: all)."""
        wanted = [conv.state_to_proto(parse_state(s)) for s in states or ()]
        jobs: list[Job] = []
        token = ""
        while True:
            size = max(limit - len(jobs), 0)
            message = generation_pb2.ListJobsRequest(
                states=wanted, model=model, page_size=size, page_token=token
            )
            resp = await self._call(self.generation.ListJobs, message)
            jobs.extend(conv.job_from_proto(j) for j in resp.jobs)
            token = resp.next_page_token
            if not token or not resp.jobs or (limit and len(jobs) >= limit):
                return jobs[:limit] if limit else jobs

    async def watch(
        self, job_id: str, after_sequence: int = 0, *, timeout: float | None = None
    ) -> AsyncGenerator[JobEvent, None]:
        """The job's events from the start (or after `after_sequence`) until the server ends the stream."""
        message = generation_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
        async for resp in self._stream(self.generation.WatchJob, message, timeout):
            yield conv.event_from_proto(resp.event)

    async def cancel(self, job_id: str) -> CancelResult:
        """Cancel a queued or running job; the result's `cancelled` is False if it had already ended."""
        message = generation_pb2.CancelJobRequest(job_id=job_id)
        resp = await self._call(self.generation.CancelJob, message)
        return CancelResult(**vars(conv.job_from_proto(resp.job)), cancelled=resp.cancelled)

    async def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> GenerateResult:
        """Follow a job to its end and return its result (see `Client.wait`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = JobFollower(job_id)
        while True:
            ended = False
            events = self.watch(job_id, follower.last_sequence, timeout=remaining(deadline))
            try:
                async with contextlib.aclosing(events):
                    async for event in events:
                        if on_event is not None:
                            on_event(event)
                        if ended := follower.feed(event):
                            break
            except errors.DeadlineExceeded:
                if timeout is None:
                    raise
                raise wait_timed_out(job_id, timeout) from None
            if ended:
                return follower.outcome(await self.get_job(job_id) if follower.needs_job else None)
            job = await self.get_job(job_id)
            if job.state.terminal:
                return follower.outcome(job)
            if timeout is not None and time.monotonic() >= (deadline or 0):
                raise wait_timed_out(job_id, timeout)
            await asyncio.sleep(0.2)

    async def download_artifact(self, job_id: str, index: int, *, timeout: float | None = None) -> bytes:
        """The bytes of artifact `index` of a finished job, streamed in chunks."""
        message = generation_pb2.DownloadArtifactRequest(job_id=job_id, index=index)
        chunks = [r.chunk async for r in self._stream(self.generation.DownloadArtifact, message, timeout)]
        return b"".join(chunks)

    async def save(self, result: GenerateResult, folder: str | os.PathLike[str]) -> list[Path]:
        """Write every artifact into `folder` under its file name, downloading those not inline."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for artifact in result.artifacts:
            data = artifact.data or await self.download_artifact(result.job_id, artifact.index)
            path = target / artifact_file_name(result.job_id, artifact)
            path.write_bytes(data)
            paths.append(path)
        return paths

    # ---- catalog and cluster -------------------------------------------------------------

    async def list_models(self, task: Task | str | None = None) -> list[ModelSpec]:
        """Catalog entries, optionally only those that do `task`."""
        message = models_pb2.ListModelsRequest(task=conv.task_to_proto(parse_task(task) if task else None))
        return [conv.model_from_proto(m) for m in (await self._call(self.models.ListModels, message)).models]

    async def describe_model(self, name: str) -> ModelSpec:
        """One catalog entry by id or alias."""
        resp = await self._call(self.models.DescribeModel, models_pb2.DescribeModelRequest(model=name))
        return conv.model_from_proto(resp.model)

    async def load_model(
        self,
        model: str,
        *,
        workers: int = 0,
        worker_ids: Sequence[str] = (),
        timeout: float | None = None,
    ) -> list[ModelOutcome]:
        """Make `model` warm on `workers` workers that can serve it and wait for the loads.

        `workers` 0 = every one that can (of `worker_ids` when given); workers warm already
        count. An admin key with auth on. One outcome per worker.
        """
        message = models_pb2.LoadModelRequest(model=model, workers=workers, worker_ids=list(worker_ids))
        reply = await self._call(self.models.LoadModel, message, timeout)
        return [conv.model_outcome_from_proto(o) for o in reply.outcomes]

    async def unload_model(
        self, model: str, *, worker_ids: Sequence[str] = (), timeout: float | None = None
    ) -> list[ModelOutcome]:
        """Free `model` on `worker_ids` (empty: every worker that serves it).

        Each worker frees it once its running jobs of it end. An admin key with auth on. One
        outcome per worker.
        """
        message = models_pb2.UnloadModelRequest(model=model, worker_ids=list(worker_ids))
        reply = await self._call(self.models.UnloadModel, message, timeout)
        return [conv.model_outcome_from_proto(o) for o in reply.outcomes]

    async def list_workers(self) -> list[WorkerInfo]:
        """The workers connected to the controller."""
        resp = await self._call(self.cluster.ListWorkers, cluster_pb2.ListWorkersRequest())
        return [conv.worker_from_proto(w) for w in resp.workers]

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        """Let a worker finish what it runs, give it nothing new, and stop it."""
        message = cluster_pb2.DrainWorkerRequest(worker_id=worker_id)
        return conv.worker_from_proto((await self._call(self.cluster.DrainWorker, message)).worker)

    async def webhook_secret(self, tenant: str = "") -> str:
        """The `whsec_...` secret that signs this caller's webhooks (another tenant's: admins only)."""
        message = generation_pb2.GetWebhookSecretRequest(tenant=tenant)
        return str((await self._call(self.generation.GetWebhookSecret, message)).secret)
