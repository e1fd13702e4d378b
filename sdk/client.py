"""The synchronous client of the OmniRT controller.

`Client` wraps the generated stubs: keyword arguments (or a `GenerateRequest`) in, plain
dataclasses out, and every failed call raised as a typed `omnirt.errors.OmniRTError`. The
helpers at the top (request building, error mapping, following a job to its end) are shared
with `omnirt.aio.AsyncClient`.
"""

from __future__ import annotations

import collections
import dataclasses
import mimetypes
import os
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any, TypedDict, Unpack

import grpc

from omnirt import errors
from omnirt._internal import convert as conv
from omnirt._internal.limits import MAX_MESSAGE_BYTES
from omnirt.session import RealtimeSession, session_open
from omnirt.types import (
    Adapter,
    Artifact,
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    MediaInput,
    MediaRole,
    ModelOutcome,
    ModelSpec,
    SessionInfo,
    Task,
    ValidationResult,
    Webhook,
    WebhookEvent,
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

DEFAULT_ADDRESS = "127.0.0.1:50051"
ADDRESS_ENV = "OMNIRT_CONTROLLER"
TLS_CA_ENV = "OMNIRT_TLS_CA"  # a CA file: connect over TLS and trust it
API_KEY_ENV = "OMNIRT_API_KEY"

Media = bytes | str | os.PathLike[str]
Metadata = Sequence[tuple[str, str]]
PathArg = str | os.PathLike[str]


class RequestFields(TypedDict, total=False):
    """The keyword arguments that build a `GenerateRequest` (see its fields).

    `image`, `mask` and `audio` are shortcuts: bytes, a local path, or a URI
    (`scheme://...`), added to `inputs` with the matching role. Adapters may be given by name.
    `webhook` may be a URL (or a `Webhook`); `webhook_events` picks its events by name
    ("queued", "started", "progress", "completed", "failed", "cancelled"; all when unset).
    A field passed as None is left unset.
    """

    model: str
    task: Task | str
    prompt: str
    negative_prompt: str
    inputs: Sequence[MediaInput]
    image: Media | None
    mask: Media | None
    audio: Media | None
    width: int | None
    height: int | None
    num_frames: int | None
    fps: float | None
    num_inference_steps: int | None
    guidance_scale: float | None
    seed: int | None
    scheduler: str | None
    num_outputs: int | None
    preset: str | None
    adapters: Sequence[Adapter | str]
    priority: int | None
    deadline_ms: int | None
    timeout_ms: int | None
    idempotency_key: str | None
    labels: Mapping[str, str]
    extra: Mapping[str, Any]
    output_format: str | None
    inline_limit_bytes: int | None
    quality: int | None
    strength: float | None
    duration_ms: int | None
    webhook: Webhook | str | None
    webhook_events: Sequence[WebhookEvent | str] | None


_SHORTCUTS = {"image": MediaRole.IMAGE, "mask": MediaRole.MASK, "audio": MediaRole.AUDIO}
_REQUEST_FIELDS = {f.name for f in dataclasses.fields(GenerateRequest)}


def default_address() -> str:
    """The controller address: `$OMNIRT_CONTROLLER`, else 127.0.0.1:50051."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


def channel_options(options: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """Explicit message-size limits, overridden by any of the caller's `options`."""
    merged = {
        "grpc.max_send_message_length": MAX_MESSAGE_BYTES,
        "grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
    }
    merged.update(dict(options))
    return list(merged.items())


def _refuse_password() -> bytes:
    # Without a callback OpenSSL would stop and prompt on the terminal for an encrypted key.
    raise ValueError("key: the private key is encrypted; give an unencrypted PEM key")


def channel_credentials(
    tls: bool | None, ca: PathArg | None, cert: PathArg | None, key: PathArg | None
) -> grpc.ChannelCredentials | None:
    """TLS credentials from a client's `tls`, `ca`, `cert` and `key` arguments, or None (plaintext).

    `ca` defaults to `$OMNIRT_TLS_CA` unless `tls=False`; a CA or a client certificate implies
    TLS; `tls=True` alone trusts the system's root certificates. The files are read here, once,
    and checked (ValueError naming the argument and the file), so a wrong file is not a
    handshake failure later. An unreadable file raises its OSError.
    """
    if ca is None and tls is not False:
        ca = os.environ.get(TLS_CA_ENV) or None
    if (cert is None) != (key is None):
        raise ValueError("cert= and key= go together: a client certificate and its private key")
    if tls is None:
        tls = ca is not None or cert is not None
    if not tls:
        if ca is not None or cert is not None:
            raise ValueError("ca=, cert= and key= need TLS, and tls=False was given")
        return None
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    roots = None
    if ca is not None:
        roots = Path(ca).read_bytes()
        try:
            probe.load_verify_locations(cadata=roots.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError):
            raise ValueError(f"ca: {os.fspath(ca)}: not a PEM certificate bundle") from None
    chain = private = None
    if cert is not None and key is not None:
        chain, private = Path(cert).read_bytes(), Path(key).read_bytes()
        try:
            probe.load_cert_chain(cert, key, password=_refuse_password)
        except ssl.SSLError as exc:
            what = (
                "does not match the certificate"
                if "KEY_VALUES_MISMATCH" in str(exc).upper()
                else "is not PEM"
            )
            raise ValueError(f"cert/key: {os.fspath(cert)} / {os.fspath(key)}: the key {what}") from None
    return grpc.ssl_channel_credentials(root_certificates=roots, private_key=private, certificate_chain=chain)


def api_key_or_env(api_key: str | None) -> str:
    """The API key to send: `api_key`, else `$OMNIRT_API_KEY`, else "" (none; "" also turns off the env).

    ValueError when it cannot travel as a gRPC header (never with the key in the message).
    """
    key = os.environ.get(API_KEY_ENV, "") if api_key is None else api_key
    key = key.strip()
    if key and not (key.isascii() and key.isprintable() and " " not in key):
        raise ValueError("api_key: must be printable ASCII without spaces")
    return key


def bearer_entry(api_key: str) -> tuple[str, str]:
    """The metadata entry that carries `api_key`."""
    return ("authorization", f"Bearer {api_key}")


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    """A call's details with other metadata (grpc's own class cannot be built)."""


class BearerKeyInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds `authorization: Bearer KEY` to every call of a channel, the raw stubs' included.

    An interceptor rather than call credentials: grpc sends those only over TLS, and a
    controller on loopback may check keys without TLS.
    """

    def __init__(self, api_key: str) -> None:
        self._entry = bearer_entry(api_key)

    def __repr__(self) -> str:
        return "BearerKeyInterceptor(<key>)"

    def _details(self, details: Any) -> _CallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            (*(details.metadata or ()), self._entry),
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Any, client_call_details: Any, request_iterator: Any
    ) -> Any:
        """The call with the key added to its metadata."""
        return continuation(self._details(client_call_details), request_iterator)


def media_input(role: MediaRole | str, value: Media) -> MediaInput:
    """An input from bytes, a local path or a URI (`scheme://...`)."""
    role = MediaRole(role)
    if isinstance(value, bytes | bytearray):
        return MediaInput(role=role, data=bytes(value))
    text = os.fspath(value)
    if isinstance(value, str) and "://" in text:
        return MediaInput(role=role, uri=text)
    media = MediaInput.from_file(role, text)
    media.mime_type = mimetypes.guess_type(text)[0] or ""
    return media


def parse_task(value: Task | str) -> Task:
    """`Task` from its value ("text2image"); InvalidRequest names the known ones."""
    try:
        return Task(value)
    except ValueError:
        known = ", ".join(t.value for t in Task)
        raise errors.InvalidRequest(f"task: unknown task {value!r} (known: {known})", field="task") from None


def parse_state(value: JobState | str) -> JobState:
    """`JobState` from its value ("running"); InvalidRequest names the known ones."""
    try:
        return JobState(value)
    except ValueError:
        known = ", ".join(s.value for s in JobState)
        raise errors.InvalidRequest(
            f"states: unknown job state {value!r} (known: {known})", field="states"
        ) from None


def artifact_file_name(job_id: str, artifact: Artifact) -> str:
    """The artifact's suggested file name (never a path), else `JOB-INDEX.EXT` from its MIME type."""
    name = Path(artifact.file_name).name
    if name:
        return name
    ext = (mimetypes.guess_extension(artifact.mime_type) or "") if artifact.mime_type else ""
    return f"{job_id}-{artifact.index}{ext}"


def build_request(request: GenerateRequest | None = None, **fields: Any) -> GenerateRequest:
    """A `GenerateRequest` from keywords, or a copy of `request` with the keywords applied."""
    fields = {k: v for k, v in fields.items() if v is not None}
    media = [media_input(role, fields.pop(name)) for name, role in _SHORTCUTS.items() if name in fields]
    if "webhook" in fields or "webhook_events" in fields:
        fields["webhook"] = webhook_of(fields.get("webhook"), fields.pop("webhook_events", None))
    unknown = sorted(set(fields) - _REQUEST_FIELDS)
    if unknown:
        raise TypeError(f"unexpected request field(s): {', '.join(unknown)}")
    if request is None:
        if not fields.get("model"):
            raise TypeError("a request needs model= (or request=GenerateRequest(...))")
        req = GenerateRequest(**fields)
    else:
        req = dataclasses.replace(request, **fields)
    req.task = parse_task(req.task) if req.task else None
    req.inputs = [*req.inputs, *media]
    req.adapters = [a if isinstance(a, Adapter) else Adapter(name=a) for a in req.adapters]
    req.labels = dict(req.labels)
    req.extra = dict(req.extra)
    return req


def webhook_of(webhook: Webhook | str | None, events: Sequence[WebhookEvent | str] | None) -> Webhook:
    """A `Webhook` from a URL or a `Webhook`, with `events` (names) when given."""
    if webhook is None:
        raise TypeError("webhook_events= needs webhook= (the URL to deliver them to)")
    hook = Webhook(url=webhook) if isinstance(webhook, str) else dataclasses.replace(webhook)
    if events is not None:
        if isinstance(events, str):
            events = [events]
        known = ", ".join(e.value for e in WebhookEvent)
        try:
            hook.events = [WebhookEvent(e) for e in events]
        except ValueError as exc:
            raise errors.InvalidRequest(
                f"webhook.events: {exc} (known: {known})", field="webhook.events"
            ) from None
    return hook


# Messages of grpc core (not of the controller) that mean the address could not be reached.
_TRANSPORT_FAILURES = (
    "failed to connect",
    "errors resolving",
    "dns resolution failed",
    "connection refused",
    "connection reset",
    "socket closed",
    "connections to all backends failing",
)


def map_rpc_error(exc: grpc.RpcError, address: str) -> errors.OmniRTError:
    """The typed error of a failed call; an unreachable controller names its address."""
    err = errors.from_rpc_error(exc)
    if isinstance(err, errors.Unavailable) and any(s in err.message.lower() for s in _TRANSPORT_FAILURES):
        err = errors.Unavailable(f"cannot reach the controller at {address} ({err.message})")
    return err


def validation_from_proto(msg: generation_pb2.ValidateResponse) -> ValidationResult:
    """`ValidateResponse` -> `ValidationResult` (not in `omnirt._internal.convert` yet)."""
    return ValidationResult(
        model=msg.model,
        task=conv.task_from_proto(msg.task),  # type: ignore[arg-type]  # a valid plan has a task
        execution_mode=msg.execution_mode,
        config_resolved=conv.dict_from_struct(msg.config_resolved),
        warnings=list(msg.warnings),
    )


@dataclasses.dataclass
class CancelResult(Job):
    """The job after a cancel request; `cancelled` is False when it had already finished."""

    cancelled: bool = False


class JobFollower:
    """Follows a job's events to its end and turns the end into a result or a typed error."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.last_sequence = 0
        self.state: JobState | None = None
        self.result: GenerateResult | None = None
        self._error: JobError | None = None

    def feed(self, event: JobEvent) -> bool:
        """Take one event; True once the job has reached its end."""
        self.last_sequence = max(self.last_sequence, event.sequence)
        if event.kind is EventKind.RESULT and event.result is not None:
            self.result = event.result
            self.state = JobState.SUCCEEDED
        elif event.kind is EventKind.STATE and event.state is not None:
            self.state = event.state
            # Only the final state's error counts (a requeue after a lost worker carries one too).
            self._error = event.error if event.state.terminal else None
        return self.state is not None and self.state.terminal

    @property
    def needs_job(self) -> bool:
        """True when the outcome must be read from the job (a success without its result)."""
        return self.state is not JobState.SUCCEEDED or self.result is None

    def outcome(self, job: Job | None = None) -> GenerateResult:
        """The result of a succeeded job; raise the typed error of a failed or cancelled one."""
        if job is not None:
            self.state = job.state
            self.result = job.result or self.result
            self._error = job.error or self._error
        if self.state is JobState.SUCCEEDED and self.result is not None:
            return self.result
        err = self._error
        if err is not None:
            raise errors.error_for(err.code, err.message, field=err.field)
        if self.state is JobState.CANCELLED:
            raise errors.Cancelled(f"job {self.job_id} was cancelled")
        if self.state is JobState.FAILED:
            raise errors.ExecutionFailed(f"job {self.job_id} failed without an error message")
        state = self.state.value if self.state else "unknown"
        raise errors.FailedPrecondition(f"job {self.job_id} is {state} and has no result")


def wait_timed_out(job_id: str, timeout: float) -> errors.DeadlineExceeded:
    """The error a wait that gave up after `timeout` seconds raises (the job itself may still run)."""
    return errors.DeadlineExceeded(f"job {job_id} did not finish within {timeout:g} s (it may still run)")


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a `time.monotonic()` deadline (None: no deadline)."""
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


class Client:
    """A connection to one controller.

    `address` defaults to `$OMNIRT_CONTROLLER`, else 127.0.0.1:50051. `timeout` (seconds)
    is the default deadline of unary calls; `metadata` goes with every call; `options` are
    extra gRPC channel options. The generated stubs stay reachable as `generation`, `models`
    and `cluster` (the API key goes with their calls too).

    TLS: `ca` (a PEM CA file, default `$OMNIRT_TLS_CA`) connects over TLS and trusts that CA;
    `tls=True` alone trusts the system's roots; `cert` and `key` (PEM files) are a client
    certificate for a controller that asks for one; `tls=False` stays plaintext whatever the
    environment says; `credentials` (grpc's own) replaces all four. `api_key` (default
    `$OMNIRT_API_KEY`) is sent as `authorization: Bearer KEY` on every call, over TLS or not.
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
        key_value = api_key_or_env(api_key)
        if credentials is None:
            channel = grpc.insecure_channel(self.address, options=opts)
        else:
            channel = grpc.secure_channel(self.address, credentials, options=opts)
        self._raw_channel = channel
        self.channel = (
            grpc.intercept_channel(channel, BearerKeyInterceptor(key_value)) if key_value else channel
        )
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

    def _call(self, method: Any, message: Any, timeout: float | None = None) -> Any:
        try:
            return method(message, timeout=timeout or self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address) from None

    def _stream(self, method: Any, message: Any, timeout: float | None) -> Iterator[Any]:
        call = method(message, timeout=timeout, metadata=self.metadata)
        try:
            yield from call
        except grpc.RpcError as exc:
            raise map_rpc_error(exc, self.address) from None
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
        data = None
        if image is not None:
            media = media_input(MediaRole.IMAGE, image)
            if media.uri:
                raise errors.InvalidRequest(
                    "image: a session's portrait is bytes or a file, not a URI", field="image"
                )
            data = media.data
        opened = session_open(
            model, data, video_encoding=video_encoding, fps=fps, width=width, height=height,
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
        req = build_request(request, **fields)
        resp = self._call(self.generation.Generate, conv.request_to_proto(req), timeout)
        if resp.HasField("result"):
            return conv.result_from_proto(resp.result)
        job = conv.job_from_proto(resp.job)
        return JobFollower(job.id).outcome(job)

    def submit(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> Job:
        """Queue a generation and return its job at once (see `wait` and `watch`)."""
        req = build_request(request, **fields)
        message = generation_pb2.SubmitRequest(request=conv.request_to_proto(req))
        return conv.job_from_proto(self._call(self.generation.Submit, message, timeout).job)

    def validate(
        self,
        request: GenerateRequest | None = None,
        *,
        timeout: float | None = None,
        **fields: Unpack[RequestFields],
    ) -> ValidationResult:
        """Resolve a request into its execution plan without running it."""
        req = build_request(request, **fields)
        message = generation_pb2.ValidateRequest(request=conv.request_to_proto(req))
        return validation_from_proto(self._call(self.generation.Validate, message, timeout))

    # ---- jobs ----------------------------------------------------------------------------

    def get_job(self, job_id: str) -> Job:
        """The job as it stands now."""
        resp = self._call(self.generation.GetJob, generation_pb2.GetJobRequest(job_id=job_id))
        return conv.job_from_proto(resp.job)

    def list_jobs(
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
            resp = self._call(self.generation.ListJobs, message)
            jobs.extend(conv.job_from_proto(j) for j in resp.jobs)
            token = resp.next_page_token
            if not token or not resp.jobs or (limit and len(jobs) >= limit):
                return jobs[:limit] if limit else jobs

    def watch(
        self, job_id: str, after_sequence: int = 0, *, timeout: float | None = None
    ) -> Iterator[JobEvent]:
        """The job's events from the start (or after `after_sequence`) until the server ends the stream."""
        message = generation_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
        for resp in self._stream(self.generation.WatchJob, message, timeout):
            yield conv.event_from_proto(resp.event)

    def cancel(self, job_id: str) -> CancelResult:
        """Cancel a queued or running job; the result's `cancelled` is False if it had already ended."""
        resp = self._call(self.generation.CancelJob, generation_pb2.CancelJobRequest(job_id=job_id))
        job = conv.job_from_proto(resp.job)
        return CancelResult(**vars(job), cancelled=resp.cancelled)

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
        deadline = None if timeout is None else time.monotonic() + timeout
        follower = JobFollower(job_id)
        while True:
            ended = False
            try:
                for event in self.watch(job_id, follower.last_sequence, timeout=remaining(deadline)):
                    if on_event is not None:
                        on_event(event)
                    if ended := follower.feed(event):
                        break
            except errors.DeadlineExceeded:
                # Only our own deadline ends the watch call this way; a job's expired deadline
                # arrives as its FAILED state and is raised by `outcome` below.
                if timeout is None:
                    raise
                raise wait_timed_out(job_id, timeout) from None
            if ended:
                return follower.outcome(self.get_job(job_id) if follower.needs_job else None)
            job = self.get_job(job_id)
            if job.state.terminal:
                return follower.outcome(job)
            # The stream ended early (a controller restart, a proxy): resume after the last event.
            if timeout is not None and time.monotonic() >= (deadline or 0):
                raise wait_timed_out(job_id, timeout)
            time.sleep(0.2)

    def download_artifact(self, job_id: str, index: int, *, timeout: float | None = None) -> bytes:
        """The bytes of artifact `index` of a finished job, streamed in chunks."""
        message = generation_pb2.DownloadArtifactRequest(job_id=job_id, index=index)
        return b"".join(r.chunk for r in self._stream(self.generation.DownloadArtifact, message, timeout))

    def save(self, result: GenerateResult, folder: str | os.PathLike[str]) -> list[Path]:
        """Write every artifact into `folder` under its file name, downloading those not inline."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        paths = []
        for artifact in result.artifacts:
            data = artifact.data or self.download_artifact(result.job_id, artifact.index)
            path = target / artifact_file_name(result.job_id, artifact)
            path.write_bytes(data)
            paths.append(path)
        return paths

    # ---- catalog and cluster -------------------------------------------------------------

    def list_models(self, task: Task | str | None = None) -> list[ModelSpec]:
        """Catalog entries, optionally only those that do `task`."""
        message = models_pb2.ListModelsRequest(task=conv.task_to_proto(parse_task(task) if task else None))
        return [conv.model_from_proto(m) for m in self._call(self.models.ListModels, message).models]

    def describe_model(self, name: str) -> ModelSpec:
        """One catalog entry by id or alias."""
        resp = self._call(self.models.DescribeModel, models_pb2.DescribeModelRequest(model=name))
        return conv.model_from_proto(resp.model)

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
        message = models_pb2.LoadModelRequest(model=model, workers=workers, worker_ids=list(worker_ids))
        reply = self._call(self.models.LoadModel, message, timeout)
        return [conv.model_outcome_from_proto(o) for o in reply.outcomes]

    def unload_model(
        self, model: str, *, worker_ids: Sequence[str] = (), timeout: float | None = None
    ) -> list[ModelOutcome]:
        """Free `model` on `worker_ids` (empty: every worker that serves it).

        Each worker frees it once its running jobs of it end. An admin key with auth on. One
        outcome per worker.
        """
        message = models_pb2.UnloadModelRequest(model=model, worker_ids=list(worker_ids))
        reply = self._call(self.models.UnloadModel, message, timeout)
        return [conv.model_outcome_from_proto(o) for o in reply.outcomes]

    def list_workers(self) -> list[WorkerInfo]:
        """The workers connected to the controller."""
        resp = self._call(self.cluster.ListWorkers, cluster_pb2.ListWorkersRequest())
        return [conv.worker_from_proto(w) for w in resp.workers]

    def list_sessions(self, model: str = "") -> list[SessionInfo]:
        """The realtime sessions open now (of `model`); an admin key with auth on."""
        reply = self._call(self.cluster.ListSessions, cluster_pb2.ListSessionsRequest(model=model))
        return [
            SessionInfo(
                session_id=s.session_id,
                model=s.model,
                worker_id=s.worker_id,
                controller=s.controller,
                tenant=s.tenant,
                labels=dict(s.labels),
                opened_at=s.opened_at.ToDatetime(tzinfo=UTC) if s.HasField("opened_at") else None,
            )
            for s in reply.sessions
        ]

    def drain_worker(self, worker_id: str) -> WorkerInfo:
        """Let a worker finish what it runs, give it nothing new, and stop it."""
        resp = self._call(self.cluster.DrainWorker, cluster_pb2.DrainWorkerRequest(worker_id=worker_id))
        return conv.worker_from_proto(resp.worker)

    def webhook_secret(self, tenant: str = "") -> str:
        """The `whsec_...` secret that signs this caller's webhooks (another tenant's: admins only)."""
        message = generation_pb2.GetWebhookSecretRequest(tenant=tenant)
        return str(self._call(self.generation.GetWebhookSecret, message).secret)
