"""`Connection`: the worker's one Connect stream to the controller, kept up until closed.

The connection dials `WorkerGatewayService.Connect`, sends Hello, waits for Welcome, then reads
the controller's messages (handing each to the worker), writes what waits in the `Outbox` and
queues a Heartbeat every interval. When the stream fails it reconnects with exponential backoff
and jitter, says Hello again with the same worker id and then sends the results that finished
while it was away.

Admission (`worker/credentials.py`): the stream carries the worker's token (`--token-file`),
over TLS when asked (`--tls-ca`, `--tls`, a client certificate with `--tls-cert`). A
controller that refuses the worker (UNAUTHENTICATED, PERMISSION_DENIED) is not retried: a
wrong token does not fix itself, so the worker ends with exit code 2, EXIT_REFUSED (an
orchestrator restarts it with the new secret). A controller not reached, TLS failures
included, is retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import grpc

from omnirt import types as t
from omnirt._internal.limits import MAX_MESSAGE_BYTES, STREAM_BATCH_MAX_BYTES, STREAM_BATCH_MAX_MESSAGES
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol import tolerant
from omnirt._internal.protocol.messages import (
    AssignmentResult,
    ControllerMessage,
    Heartbeat,
    Hello,
    ItemOutcome,
    Welcome,
)
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.credentials import WorkerCredentials
from omnirt.worker.outbox import Outbox

log = logging.getLogger(__name__)

# The sentinel a stream's read() returns at its end; the grpc stubs do not declare grpc.aio.EOF.
STREAM_END: object = getattr(grpc.aio, "EOF")  # noqa: B009
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
WELCOME_TIMEOUT_S = 10.0
DEFAULT_HEARTBEAT_S = 5.0
BACKOFF_BASE_S = 0.2
# A session shorter than this does not reset the backoff (a controller that keeps closing
# the stream right after Welcome must not be hammered).
STABLE_SESSION_S = 10.0
# How long closing waits for the controller to take the half-close and end the stream.
CLOSE_TIMEOUT_S = 5.0
# The controller's answers that reconnecting does not change: the worker exits with EXIT_REFUSED.
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
EXIT_REFUSED = 2


def failure_hint(exc: grpc.aio.AioRpcError, tls: bool) -> str:
    """What to check, for a connection failure whose grpc text alone leaves one guessing."""
    details = exc.details() or ""
    if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
        return " (this port does not serve the worker stream: use the controller's --worker-listen port)"
    if "Hostname Verification" in details:
        return " (the controller's certificate does not name this address: pass --tls-server-name NAME)"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return " (the controller's certificate is not signed by a CA this worker trusts: check --tls-ca)"
    if "WRONG_VERSION_NUMBER" in details:
        return " (the controller does not serve TLS on this port: drop --tls/--tls-ca, or check the port)"
    if "Socket closed" in details:
        if not tls:
            return " (if the controller serves TLS, pass --tls-ca FILE or --tls)"
        return " (if the controller requires client certificates, pass --tls-cert and --tls-key)"
    return ""


def backoff_delay(
    attempt: int, cap_s: float, base_s: float = BACKOFF_BASE_S, rand: Callable[[], float] = random.random
) -> float:
    """Seconds to wait before reconnect `attempt` (0-based): exponential, capped, "equal jitter"."""
    ceiling = min(cap_s, base_s * (2 ** min(attempt, 30)))
    return ceiling / 2 + rand() * ceiling / 2


class Connection:
    """The Connect stream, dialled again after each failure until `close` or a refusal.

    What it asks of the rest of the worker, each a callable: `hello` and `heartbeat` (what the
    worker says about itself), `handle` (each controller message, Welcome included, after the
    connection took what it needs from it), `on_stream` (work tied to one stream, given its
    channel: cancelled when the stream ends) and `on_refused` (the controller refused this
    worker; the connection has stopped).
    """

    def __init__(
        self,
        config: WorkerConfig,
        credentials: WorkerCredentials,
        outbox: Outbox,
        *,
        hello: Callable[[], Hello],
        heartbeat: Callable[[], Heartbeat],
        handle: Callable[[ControllerMessage | None], None],
        on_stream: Callable[[grpc.aio.Channel], asyncio.Task[None] | None],
        on_refused: Callable[[], None],
    ) -> None:
        self._config = config
        self._credentials = credentials
        self._outbox = outbox
        self._hello = hello
        self._heartbeat = heartbeat
        self._handle = handle
        self._on_stream = on_stream
        self._on_refused = on_refused
        self._call: Any = None  # the Connect call, while welcomed
        self._channel: grpc.aio.Channel | None = None  # its channel, while welcomed
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._refused = False
        self._heartbeat_s = DEFAULT_HEARTBEAT_S
        self._welcomed_at: float | None = None
        self._batch_writes = False  # the controller of this session reads batches

    @property
    def connected(self) -> bool:
        """Welcomed on a stream now."""
        return self._call is not None

    @property
    def channel(self) -> grpc.aio.Channel | None:
        """The stream's channel while connected (realtime sessions and DescribeModel use it)."""
        return self._channel

    @property
    def refused(self) -> bool:
        """The controller refused this worker: the process ends with EXIT_REFUSED."""
        return self._refused

    def start(self) -> None:
        """Dial, and keep dialling after each failure, in the background."""
        self._task = asyncio.create_task(self._connection_loop(), name="omnirt-worker-connection")

    async def close(self) -> None:
        """Half-close the stream, let the controller end it (buffered results arrive), stop."""
        self._closing = True
        call, task = self._call, self._task
        if task is None:
            return
        if call is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await call.done_writing()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await asyncio.shield(task)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    def queue_heartbeat(self) -> None:
        """Queue a Heartbeat now (none while disconnected: Hello and the next stream's first
        heartbeat say it all)."""
        if self._call is None or self._closing:
            return
        self._outbox.put(wire.to_controller(self._heartbeat()))

    # ---- dialling ------------------------------------------------------------------------

    async def _connection_loop(self) -> None:
        controller = self._config.controller
        attempt = 0
        warned = False
        while not self._closing:
            self._welcomed_at = None
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REFUSALS:
                    self._refuse(exc)
                    return
                failure = f"{exc.code().name} {exc.details()}{failure_hint(exc, self._config.tls)}"
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                failure = "the controller ended the stream"
            if self._closing:
                return
            stable = (
                self._welcomed_at is not None and time.monotonic() - self._welcomed_at >= STABLE_SESSION_S
            )
            attempt = 0 if stable else attempt + 1
            delay = backoff_delay(attempt, self._config.reconnect_max_s)
            # The first failure of an outage is worth a warning; its retries are routine.
            warned = warned and self._welcomed_at is None
            level = logging.INFO if warned else logging.WARNING
            warned = True
            log.log(level, "stream to %s: %s; reconnecting in %.2f s", controller, failure, delay)
            await asyncio.sleep(delay)

    def _refuse(self, exc: grpc.aio.AioRpcError) -> None:
        """The controller will not take this worker: stop now, with EXIT_REFUSED."""
        log.error(
            "controller %s refused this worker: %s %s; not reconnecting (check --token-file or the "
            "client certificate, then restart the worker)",
            self._config.controller,
            exc.code().name,
            exc.details(),
        )
        self._refused = True
        self._on_refused()

    async def _session(self) -> None:
        stream_work: asyncio.Task[None] | None = None
        self._credentials.refresh()  # a rotated token or renewed certificate is used from now on
        async with self._credentials.channel(CHANNEL_OPTIONS) as channel:
            # Raw bytes in: the read loop parses each message itself (tolerant.controller_messages),
            # so one the worker cannot decode fails its own jobs, not the stream and all it runs.
            connect: Any = channel.stream_stream(
                wire.CONNECT_METHOD,
                request_serializer=gateway_pb2.ConnectRequest.SerializeToString,
                response_deserializer=None,
            )
            call = connect(metadata=self._credentials.metadata())
            try:
                await call.write(wire.to_controller(self._hello()))
                async with asyncio.timeout(WELCOME_TIMEOUT_S):
                    first = await call.read()
                if first is STREAM_END:
                    raise ConnectionError("the controller closed the stream before Welcome")
                messages = tolerant.controller_messages(first)
                welcome = self._parse(messages[0]) if messages else None
                if not isinstance(welcome, Welcome):
                    raise ConnectionError(f"expected Welcome, got {type(welcome).__name__}")
                self._welcomed(welcome)
                self._handle(welcome)
                self._call = call
                self._channel = channel
                stream_work = self._on_stream(channel)
                await self._serve_stream(call)
            finally:
                self._call = None
                self._channel = None  # sessions on it end with it (the controller loses them too)
                if stream_work is not None:
                    stream_work.cancel()  # its channel closes with this session; the next one retries
                dropped = self._outbox.drop_live()
                if dropped:
                    log.debug("dropped %d event(s) while disconnected", dropped)
                call.cancel()

    def _welcomed(self, welcome: Welcome) -> None:
        self._welcomed_at = time.monotonic()
        self._batch_writes = welcome.accepts_batches
        if welcome.heartbeat_interval_ms:
            self._heartbeat_s = welcome.heartbeat_interval_ms / 1000.0
        if welcome.worker_id and welcome.worker_id != self._config.worker_id:
            log.warning(
                "controller calls this worker %r; keeping %r", welcome.worker_id, self._config.worker_id
            )
        log.info(
            "connected to %s (heartbeat %.1f s, lease %d ms, %d result(s) to resend)",
            self._config.controller,
            self._heartbeat_s,
            welcome.lease_timeout_ms,
            self._outbox.durable_pending(),
        )
        for warning in welcome.warnings:
            log.warning("controller: %s", warning)

    # ---- one stream ----------------------------------------------------------------------

    async def _serve_stream(self, call: Any) -> None:
        # Busy slots and draining right away: Hello does not carry them.
        self.queue_heartbeat()
        tasks = [
            asyncio.create_task(self._read_loop(call)),
            asyncio.create_task(self._write_loop(call)),
            asyncio.create_task(self._heartbeat_loop()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_loop(self, call: Any) -> None:
        while True:
            msg = await call.read()
            if msg is STREAM_END:
                return
            for one in tolerant.controller_messages(msg):
                message = self._parse(one)
                if isinstance(message, Welcome):  # a later Welcome (settings changed)
                    self._welcomed(message)
                self._handle(message)

    def _parse(self, one: gateway_pb2.ConnectResponse | tolerant.Undecodable) -> ControllerMessage | None:
        """What the controller sent; an assignment that cannot be read is answered with an error
        here (None: the rest of the worker never sees it)."""
        if isinstance(one, tolerant.Undecodable):
            log.error("cannot decode a controller message (assignment %r): %s", one.assignment_id, one.reason)
            self._refuse_unreadable(
                one.assignment_id, one.job_ids, f"the worker cannot decode the assignment: {one.reason}"
            )
            return None
        try:
            return wire.from_controller(one)
        except Exception as exc:
            log.exception("cannot read a controller message")
            assignment_id, job_ids = tolerant.assignment_job_ids(one)
            self._refuse_unreadable(assignment_id, job_ids, f"the worker cannot read the assignment: {exc}")
            return None

    def _refuse_unreadable(self, assignment_id: str, job_ids: list[str], reason: str) -> None:
        for job_id in job_ids:
            outcome = ItemOutcome(job_id, error=t.JobError("INVALID_ARGUMENT", reason))
            self._outbox.put(wire.to_controller(AssignmentResult(assignment_id, outcome)), durable=True)

    async def _write_loop(self, call: Any) -> None:
        while True:
            # Messages queued while a write is in flight go up together as one batch (when the
            # controller reads batches).
            limit = STREAM_BATCH_MAX_MESSAGES if self._batch_writes else 1
            items = await self._outbox.get_many(
                limit, STREAM_BATCH_MAX_BYTES, gateway_pb2.ConnectRequest.ByteSize
            )
            if len(items) == 1:
                message = items[0].message
            else:
                message = wire.batch_to_controller([item.message for item in items])
            try:
                await call.write(message)
            except BaseException:
                for item in reversed(items):  # reversed: kept results go back in their order
                    if not self._outbox.failed(item) and item.durable:
                        log.error("giving up on a result after %d failed writes", item.attempts)
                raise
            for item in items:
                self._outbox.sent(item)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            self.queue_heartbeat()
