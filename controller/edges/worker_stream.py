"""WorkerGatewayService: the bidirectional stream each worker keeps with the controller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc

from omnirt._internal import convert as c
from omnirt._internal.limits import STREAM_BATCH_MAX_BYTES, STREAM_BATCH_MAX_MESSAGES
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol.messages import (
    RECONNECT_KEY,
    RECONNECT_VALUE,
    Assignment,
    AssignmentEvent,
    ControllerMessage,
    ModelLoaded,
    Welcome,
)
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.bounds import check_id
from omnirt.controller.core.encoded import ArrivingResults
from omnirt.controller.core.engine_client import EngineClient
from omnirt.controller.core.jobs import RECONNECT_REASON, artifact_reference
from omnirt.controller.core.router import WorkerHandle, WorkerLink, worker_info
from omnirt.controller.edges.shutdown import Shutdown
from omnirt.controller.edges.worker_auth import WorkerAdmission
from omnirt.controller.realtime.manager import SessionManager
from omnirt.controller.realtime.servicer import worker_session
from omnirt.errors import Unavailable
from omnirt.types import GenerateResult, JobError
from omnirt.v1 import types_pb2

log = logging.getLogger("omnirt.controller.edges.worker_stream")
# The end of the link, queued after the messages before it (a marker, not a message).
_CLOSE = None
Pending = ControllerMessage | tuple[pb.ConnectResponse, ControllerMessage] | None


class StreamLink:
    """WorkerLink over the Connect stream: messages wait in a queue the response stream drains."""

    def __init__(self) -> None:
        # Messages, or (converted, message) for one that did not fit in the last batch.
        self._pending: deque[Pending] = deque()
        self._ready = asyncio.Event()
        # The worker's handle (told when its assignments are written: until then its heartbeats
        # cannot list them), and the assignments of the messages the last `take` returned.
        self._handle: WorkerHandle | None = None
        self._taken: list[Assignment] = []

    def attach(self, handle: WorkerHandle) -> None:
        self._handle = handle

    def send(self, message: ControllerMessage) -> None:
        if self._handle is not None and isinstance(message, Assignment):
            self._handle.in_transit(message)
        self._pending.append(message)
        self._ready.set()

    def hand_over(self, other: WorkerLink) -> None:
        """Send on `other`, the new stream of the same worker process, what this closed link has
        not written: the messages still queued, and the assignments of a write not seen through
        (one the worker got already it takes as the same assignment again, a no-op; a drain is
        not resent that way, as a second one stops the worker's jobs)."""
        unsent: list[ControllerMessage] = list(self._taken)
        for message in self._pending:
            if message is not _CLOSE:
                unsent.append(message[1] if isinstance(message, tuple) else message)
        self._pending = deque([_CLOSE])
        self._taken.clear()
        for message in unsent:
            other.send(message)

    def written(self) -> None:
        """The messages the last `take` returned were written to the worker."""
        if self._handle is not None:
            for assignment in self._taken:
                self._handle.sent(assignment)
        self._taken.clear()

    def close(self) -> None:
        self._pending.append(_CLOSE)
        self._ready.set()

    async def take(self, max_messages: int) -> list[pb.ConnectResponse] | None:
        """The next messages for the worker, converted, in order; None once the link is closed.

        The first is taken whatever its size, then those queued behind it up to `max_messages`
        and STREAM_BATCH_MAX_BYTES in all.
        """
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        taken: list[pb.ConnectResponse] = []
        total = 0
        while self._pending and len(taken) < max_messages:
            head = self._pending[0]
            if head is _CLOSE:
                return taken or None  # what came before the close goes first
            if isinstance(head, tuple):  # converted already: it did not fit in the last batch
                message, outbound = head
            else:
                message, outbound = wire.to_worker(head), head
            if max_messages > 1:
                total += message.ByteSize()
                if taken and total > STREAM_BATCH_MAX_BYTES:
                    self._pending[0] = (message, outbound)  # the next batch starts with it
                    break
            self._pending.popleft()
            taken.append(message)
            if isinstance(outbound, Assignment):
                self._taken.append(outbound)
        return taken


class WorkerGateway(gateway_pb2_grpc.WorkerGatewayServiceServicer):
    """Translates the worker stream into EngineClient calls.

    With `admission`, a stream joins only once its Hello is admitted (token or client
    certificate): a refused one is answered UNAUTHENTICATED before the engine hears of it, so
    it never gets a job and cannot take or evict a live worker's id."""

    def __init__(
        self,
        engine: EngineClient,
        admission: WorkerAdmission | None = None,
        sessions: SessionManager | None = None,
        artifacts: ArtifactStore | None = None,
        arriving_results: ArrivingResults | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self.engine = engine
        self.shutdown = shutdown  # when it closes, a closed link tells the worker to reconnect
        self.admission = admission
        self.sessions = sessions
        self.artifacts = artifacts
        self.arriving_results = arriving_results  # the memory store's fast path (core.encoded)
        self._closing: set[asyncio.Future[None]] = set()
        self._links: set[StreamLink] = set()  # the open Connect streams'

    async def release_workers(self, timeout_s: float) -> None:
        """End every worker stream (telling the workers to reconnect while the controller shuts
        down) and wait, up to `timeout_s`, until the engine has handed their jobs back."""
        for link in list(self._links):
            link.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._links or self._closing:
                    await asyncio.sleep(0.01)

    async def WorkerSession(
        self,
        request_iterator: AsyncIterator[pb.WorkerSessionRequest],
        context: grpc.aio.ServicerContext[pb.WorkerSessionRequest, pb.WorkerSessionResponse],
    ) -> AsyncIterator[pb.WorkerSessionResponse]:
        """One realtime session's stream from the worker it was offered to (`controller/realtime`)."""
        if self.sessions is None:
            raise Unavailable("this controller hosts no realtime sessions")
        admission = self.admission

        def admit(ctx: grpc.aio.ServicerContext[Any, Any], worker_id: str) -> None:
            if admission is not None:
                admission.admit(ctx.invocation_metadata() or (), ctx.auth_context(), ctx.peer(), worker_id)

        async for message in worker_session(self.sessions, request_iterator, context, admit):
            yield message

    async def Connect(
        self,
        request_iterator: AsyncIterator[pb.ConnectRequest],
        context: grpc.aio.ServicerContext[pb.ConnectRequest, pb.ConnectResponse],
    ) -> AsyncIterator[pb.ConnectResponse]:
        first = await anext(aiter(request_iterator), None)
        if first is None or first.WhichOneof("message") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first message must be Hello")
            return
        hello = wire.hello_from_proto(first.hello)
        if not hello.worker_id or hello.slots == 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Hello needs a worker_id and slots > 0")
            return
        check_id("worker_id", hello.worker_id)  # DrainWorker must be able to name it
        if self.shutdown is not None and self.shutdown.closing.is_set():
            await self._tell_to_reconnect(context)
        if self.admission is not None:
            # Unauthenticated here: the ErrorInterceptor answers it with the standard details.
            self.admission.admit(
                context.invocation_metadata() or (), context.auth_context(), context.peer(), hello.worker_id
            )
        link = StreamLink()
        reason = "stream closed"
        handle = await self.engine.worker_connected(worker_info(hello), link)  # AlreadyExists
        handle.loads_models = hello.loads_models  # it answers LoadModel / UnloadModel
        hosting = (
            self.sessions.worker_joined(handle.info, hello.session_slots, link.send)
            if self.sessions
            else None
        )
        reader = asyncio.create_task(self._read(request_iterator, handle, link, hello.reports_running))
        config = self.engine.config
        self._links.add(link)  # from here on the finally below discards it
        try:
            yield wire.to_worker(
                Welcome(
                    worker_id=handle.id,
                    heartbeat_interval_ms=config.heartbeat_interval_ms,
                    lease_timeout_ms=config.lease_timeout_ms,
                    accepts_batches=True,
                    warnings=handle.warnings,
                    artifact_store=str(self.artifacts) if self.artifacts is not None else "",
                )
            )
            # Messages that queue up while a write goes out leave as one batch (workers whose Hello
            # accepts batches): one stream write per batch instead of one per assignment.
            limit = STREAM_BATCH_MAX_MESSAGES if hello.accepts_batches else 1
            while (messages := await link.take(limit)) is not None:
                if len(messages) == 1:
                    yield messages[0]
                else:
                    yield wire.batch_to_worker(messages)
                link.written()  # the write went out (grpc.aio resumes the generator then)
            if self.shutdown is not None and self.shutdown.closing.is_set():
                reason = RECONNECT_REASON
                await self._tell_to_reconnect(context)
        finally:
            self._links.discard(link)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            # Shielded: the stream's task may be cancelled again while the engine requeues the
            # worker's jobs (a Redis round trip), and a half-done requeue would leave them stuck.
            if self.sessions is not None and hosting is not None:
                self.sessions.worker_left(hosting)
            lost = asyncio.ensure_future(self.engine.worker_lost(handle, reason))
            self._closing.add(lost)
            lost.add_done_callback(self._closing.discard)
            await asyncio.shield(lost)

    @staticmethod
    async def _tell_to_reconnect(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """End the stream so that the worker reconnects at once (to another controller)."""
        await context.abort(
            grpc.StatusCode.UNAVAILABLE,
            "controller shutting down: reconnect",
            trailing_metadata=((RECONNECT_KEY, RECONNECT_VALUE),),
        )

    async def _read(
        self,
        request_iterator: AsyncIterator[pb.ConnectRequest],
        handle: WorkerHandle,
        link: StreamLink,
        reports_running: bool,
    ) -> None:
        try:
            async for message in request_iterator:
                await self._handle(handle, message, reports_running)
        except (grpc.aio.AioRpcError, grpc.aio.AbortError, asyncio.CancelledError):  # AbortError: we ended it
            pass
        except Exception:
            log.exception("bad message from worker", extra={"worker_id": handle.id})
        finally:
            link.close()

    async def _handle(self, handle: WorkerHandle, message: pb.ConnectRequest, reports_running: bool) -> None:
        beat = None
        for one in wire.unbatched_requests(message):  # a batch's in order; never nested
            kind = one.WhichOneof("message")
            if kind == "heartbeat":
                # Only the last of a batch counts, once the rest is read: heartbeats queued
                # while the worker could not write may all predate an assignment it has not
                # read yet, and must not count as that many heartbeats leaving it out.
                beat = one.heartbeat
            elif kind == "result":
                await self._result(handle, one.result)
            else:
                try:
                    read = wire.from_worker(one)
                except Exception:  # one message this controller cannot read costs itself, not the stream
                    log.warning(
                        "ignoring an unreadable %s from worker",
                        kind,
                        exc_info=True,
                        extra={"worker_id": handle.id},
                    )
                    continue
                if isinstance(read, AssignmentEvent):
                    await self.engine.worker_event(handle, read.assignment_id, read.event)
                elif isinstance(read, ModelLoaded):
                    await self.engine.worker_model_answer(handle, read)
        if beat is not None:
            hb = wire.heartbeat_from_proto(beat)
            # None from a worker that does not list its jobs (older): nothing is reconciled.
            running = set(hb.running.items()) if reports_running else None
            model_bytes = hb.model_bytes if handle.loads_models else None
            # The worker's own counts: they outlive this stream and this controller.
            handle.info.jobs_succeeded, handle.info.jobs_failed = hb.jobs_succeeded, hb.jobs_failed
            await self.engine.worker_heartbeat(handle, hb.loaded_models, hb.draining, running, model_bytes)
            if self.sessions is not None:
                self.sessions.worker_beat(handle.id, hb.loaded_models, hb.draining)

    async def _result(self, handle: WorkerHandle, r: pb.AssignmentResult) -> None:
        """One job's end. The message goes along opaquely: the memory store may keep its bytes."""
        try:
            refused = accept_stored(r.result, r.job_id, self.artifacts) if r.HasField("result") else ""
            if refused:  # fails this job alone, saying where the worker put the bytes
                log.warning(refused, extra={"worker_id": handle.id, "job_id": r.job_id})
                r.error.CopyFrom(c.error_to_proto(JobError("INTERNAL", refused[:1000])))
            outcome = wire.result_from_proto(r).outcome
            result, error = outcome.result, outcome.error
        except Exception as exc:  # fails this job alone: the stream carries the others' results
            log.exception("unreadable result from worker", extra={"worker_id": handle.id, "job_id": r.job_id})
            reason = f"the controller cannot read the worker's result: {type(exc).__name__}: {exc}"
            result, error = None, JobError("INTERNAL", reason[:300])
        # The memory store may keep the message's bytes as they came (core.encoded).
        arriving = (
            self.arriving_results.arriving(r.job_id, r.assignment_id, WireResult(r.result))
            if result is not None and self.arriving_results is not None
            else contextlib.nullcontext()
        )
        with arriving:
            await self.engine.worker_result(handle, r.assignment_id, r.job_id, result, error)


# ---- the worker's result as it came: stored artifacts checked, bytes kept (core.encoded) ------


def accept_stored(message: types_pb2.GenerateResult, job_id: str, store: ArtifactStore | None) -> str:
    """Check the worker's artifact-store references and give clients their links (in place).

    An artifact with `object_uri` must name an object of this job in this controller's store;
    it gets the DownloadArtifact reference as `uri` and a presigned `url`. A worker never sets
    `url` itself. Returns "" or why the result cannot be taken (the job fails with it)."""
    for a in message.artifacts:
        a.ClearField("url")
        a.ClearField("url_expires_at_ms")
        if not a.object_uri:
            continue
        if store is None:
            return (
                f"the worker stored artifact {a.index} at {a.object_uri[:200]!r}, "
                "but this controller has no --artifact-store"
            )
        try:
            _, url, expires_ms = store.reference(job_id, a.object_uri)
        except ValueError as exc:
            return str(exc)
        a.ClearField("data")
        a.uri = artifact_reference(job_id, a.index)
        a.url = url
        a.url_expires_at_ms = expires_ms
    return ""


class WireResult:
    """A worker's result message as a `core.encoded.ResultEncoding` (opaque to the memory store)."""

    __slots__ = ("_message",)

    def __init__(self, message: types_pb2.GenerateResult) -> None:
        self._message = message

    def keeps(self, result: GenerateResult) -> bool:
        """True when `result` has every artifact of the message as it was (sizes, references)."""
        sent = self._message.artifacts
        return len(sent) == len(result.artifacts) and all(
            m.uri == a.uri and m.size_bytes == a.size_bytes
            for m, a in zip(sent, result.artifacts, strict=True)
        )

    def stamped(self, job_id: str, trace_id: str, tenant: str) -> bytes:
        """The message's bytes with the controller's ids (the message is the stream's, used once)."""
        message = self._message
        message.job_id = job_id
        message.report.trace_id = trace_id
        message.report.tenant = tenant
        return message.SerializeToString()
