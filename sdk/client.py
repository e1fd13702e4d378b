"""The synchronous client of the OmniRT controller.

`Client` takes keyword arguments (or a `GenerateRequest`), returns plain dataclasses and raises
every failed call as a typed `omnirt.errors.OmniRTError`. What each method sends and what it
makes of the answers is written once, for this client and `omnirt.aio.AsyncClient`, in
`omnirt._internal.calls`; the channel (TLS, the API key) in `omnirt._internal.channel`. This
module only makes the blocking calls.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Unpack

import grpc

from omnirt import errors
from omnirt._internal import calls
from omnirt._internal.calls import CancelResult
from omnirt._internal.channel import (
    ADDRESS_ENV,
    API_KEY_ENV,
    DEFAULT_ADDRESS,
    TLS_CA_ENV,
    ChannelSettings,
    Metadata,
    PathArg,
    open_channel,
)
from omnirt._internal.requests import Media, RequestFields
from omnirt.session import RealtimeSession, session_open
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

# Names this module has always offered (the environment variables, the result of `cancel`, the
# keywords of `generate`), kept here for code that imports them from it.
__all__ = [
    "ADDRESS_ENV",
    "API_KEY_ENV",
    "DEFAULT_ADDRESS",
    "TLS_CA_ENV",
    "CancelResult",
    "Client",
    "Media",
    "Metadata",
    "RequestFields",
]

T = TypeVar("T")


class Client:
    """A connection to one controller.

    `address` defaults to `$OMNIRT_CONTROLLER`, else 127.0.0.1:50051. `timeout` (seconds)
    is the default deadline of unary calls; `metadata` goes with every call; `options` are
    extra gRPC channel options. The generated stubs stay reachable as `generation`, `models`,
    `cluster` and `realtime` (the API key goes with their calls too).

    TLS: `ca` (a PEM CA file, default `$OMNIRT_TLS_CA`) connects over TLS and trusts that CA;
    `tls=True` alone trusts the system's roots; `cert` and `key` (PEM files) are a client
    certificate for a controller that asks for one; `tls=False` stays plaintext whatever the
    environment says; `credentials` (grpc's own) replaces all four. `api_key` (default
    `$OMNIRT_API_KEY`) is sent as `authorization: Bearer KEY` on every call, over TLS or not.

    Calls that are safe to repeat (reads, cancels, `validate`, and `submit`/`generate` with an
    `idempotency_key`) are sent again up to `retries` times, with backoff, when the controller
    cannot be reached or is shutting down (UNAVAILABLE); `wait`/`watch` resume after their last
    event. `retries=0` turns that off.
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
        self._raw_channel, self.channel = open_channel(settings)
        self.generation = generation_pb2_grpc.GenerationServiceStub(self.channel)
        self.models = models_pb2_grpc.ModelServiceStub(self.channel)
        self.cluster = cluster_pb2_grpc.ClusterServiceStub(self.channel)
        self.realtime = realtime_pb2_grpc.RealtimeServiceStub(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel; calls in flight are cancelled."""
        self._raw_channel.close()

    def __repr__(self) -> str:
        return f"Client({self.address!r}{', tls=True' if self.tls else ''})"  # never the key

    # ---- the blocking I/O under `omnirt._internal.calls` ---------------------------------

    def _run(self, plan: calls.Plan[T]) -> T:
        return calls.run(plan, self._perform, self.retries)

    def _perform(self, step: calls.Step) -> Any:
        """One step of a plan: a unary call, a stream followed to its end, or a pause."""
        if isinstance(step, calls.Unary):
            method = getattr(getattr(self, step.service), step.method)
            try:
                return method(step.request, timeout=step.timeout or self.timeout, metadata=self.metadata)
            except grpc.RpcError as exc:
                raise errors.map_rpc_error(exc, self.address) from None
        if isinstance(step, calls.Follow):
            with contextlib.closing(self._items(step.stream)) as items:
                for item in items:
                    if step.each(item):
                        break
            return None
        time.sleep(step.seconds)
        return None

    def _items(self, stream: calls.Stream[T]) -> Generator[T, None, None]:
        method = getattr(getattr(self, stream.service), stream.method)
        call = method(stream.request, timeout=stream.timeout, metadata=self.metadata)
        try:
            for message in call:
                yield stream.parse(message)
        except grpc.RpcError as exc:
            raise errors.map_rpc_error(exc, self.address) from None
        finally:
            call.cancel()  # a no-op once the stream ended; stops it when the caller breaks off

    # ---- realtime sessions ---------------------------------------------------------------

    def open_session(
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
    ) -> RealtimeSession:
        """Open a realtime session of streaming `model`; returns once it is ready.

        `image` is its reference portrait (bytes or a path); see `omnirt.session`.
        """
        opened = session_open(
            model, image, video_encoding=video_encoding, fps=fps, width=width, height=height,
            sample_rate=sample_rate, idle_timeout_ms=idle_timeout_ms, labels=labels, config=config,
        )  # fmt: skip
        return RealtimeSession(self.realtime, opened, self.metadata, self.address)

    # ---- generation ----------------------------------------------------------------------

    def generate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> GenerateResult:
        """Run one generation and wait for its result; `timeout` (s) is the call's deadline."""
        return self._run(calls.generate(request, timeout, fields))

    def submit(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> Job:
        """Queue a generation and return its job at once (see `wait` and `watch`)."""
        return self._run(calls.submit(request, timeout, fields))

    def validate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> ValidationResult:
        """Resolve a request into its execution plan without running it."""
        return self._run(calls.validate(request, timeout, fields))

    # ---- jobs ----------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job:
        """The job as it stands now."""
        return self._run(calls.get_job(job_id))

    def list_jobs(
        self, states: Sequence[JobState | str] | None = None, model: str = "", limit: int = 0
    ) -> list[Job]:
        """Jobs, newest first, optionally only in `states` or of `model`; at most `limit` (0: all)."""
        return self._run(calls.list_jobs(states, model, limit))

    def watch(
        self, job_id: str, after_sequence: int = 0, *, timeout: float | None = None
    ) -> Iterator[JobEvent]:
        """The job's events from the start (or after `after_sequence`) until the server ends the stream."""
        return self._items(calls.watch(job_id, after_sequence, timeout))

    def cancel(self, job_id: str) -> CancelResult:
        """Cancel a queued or running job; the result's `cancelled` is False if it had already ended."""
        return self._run(calls.cancel(job_id))

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        *,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> GenerateResult:
        """Follow a job to its end and return its result.

        Raises the job's typed error when it failed or was cancelled, and `DeadlineExceeded`
        when `timeout` seconds pass first (the job itself keeps running). `on_event` sees
        every event (progress bars).
        """
        return self._run(calls.wait(job_id, timeout, on_event))

    def download_artifact(self, job_id: str, index: int, *, timeout: float | None = None) -> bytes:
        """The bytes of artifact `index` of a finished job, streamed in chunks."""
        return self._run(calls.download_artifact(job_id, index, timeout))

    def save(self, result: GenerateResult, folder: str | os.PathLike[str]) -> list[Path]:
        """Write every artifact into `folder` under its file name, downloading those not inline."""
        return self._run(calls.save(result, folder))

    # ---- catalog and cluster -------------------------------------------------------------

    def list_models(self, task: Task | str | None = None) -> list[ModelSpec]:
        """Catalog entries, optionally only those that do `task`."""
        return self._run(calls.list_models(task))

    def describe_model(self, name: str) -> ModelSpec:
        """One catalog entry by id or alias."""
        return self._run(calls.describe_model(name))

    def load_model(
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
        return self._run(calls.load_model(model, workers, worker_ids, timeout))

    def unload_model(
        self, model: str, *, worker_ids: Sequence[str] = (), timeout: float | None = None
    ) -> list[ModelOutcome]:
        """Free `model` on `worker_ids` (empty: every worker that serves it).

        Each worker frees it once its running jobs of it end. An admin key with auth on. One
        outcome per worker.
        """
        return self._run(calls.unload_model(model, worker_ids, timeout))

    def list_workers(self) -> list[WorkerInfo]:
        """The workers connected to the controller."""
        return self._run(calls.list_workers())

    def list_sessions(self, model: str = "") -> list[SessionInfo]:
        """The realtime sessions open now (of `model`); an admin key with auth on."""
        return self._run(calls.list_sessions(model))

    def drain_worker(self, worker_id: str) -> WorkerInfo:
        """Let a worker finish what it runs, give it nothing new, and stop it."""
        return self._run(calls.drain_worker(worker_id))

    def webhook_secret(self, tenant: str = "") -> str:
        """The `whsec_...` secret that signs this caller's webhooks (another tenant's: admins only)."""
        return self._run(calls.webhook_secret(tenant))
