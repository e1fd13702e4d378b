"""`Connection`: the worker's one Connect stream to the controller, kept up until closed.

The connection dials `WorkerGatewayService.Connect`, sends Hello, waits for Welcome, then reads
the controller's messages (handing each to the worker), writes what waits in the `Outbox` and
queues a Heartbeat every interval. When the stream fails it reconnects with exponential backoff
and jitter, says Hello again with the same worker id and then sends the results that finished
while it was away.

What waits to go up is the `Outbox` (at the end). Results must reach the controller: one whose
write fails is put back at the front and sent after the next Hello. Events and heartbeats are
only useful live: they are dropped while no stream is up. A run's result waiting there can be
found by its job id (`waiting_result`): a job offered again meanwhile (a restarted controller
requeued it) gets this result re-addressed, not a second run.

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from omnirt import types as t
from omnirt._internal.limits import MAX_MESSAGE_BYTES, STREAM_BATCH_MAX_BYTES, STREAM_BATCH_MAX_MESSAGES
from omnirt._internal.protocol import convert as wire
from omnirt._internal.protocol.messages import (
    RECONNECT_KEY,
    RECONNECT_VALUE,
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
            told = False  # the controller is shutting down and told this worker to reconnect
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() in REFUSALS:
                    self._refuse(exc)
                    return
                told = (RECONNECT_KEY, RECONNECT_VALUE) in tuple(exc.trailing_metadata() or ())
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
            if told:  # a rolling restart: at once, to the controller behind the same address
                attempt, warned = 0, False
                delay = backoff_delay(0, self._config.reconnect_max_s)
                log.info("controller %s is shutting down; reconnecting in %.2f s", controller, delay)
                await asyncio.sleep(delay)
                continue
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
            # Raw bytes in: the read loop parses each message itself (wire.controller_messages),
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
                messages = wire.controller_messages(first)
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
            for one in wire.controller_messages(msg):
                message = self._parse(one)
                if isinstance(message, Welcome):  # a later Welcome (settings changed)
                    self._welcomed(message)
                self._handle(message)

    def _parse(self, one: gateway_pb2.ConnectResponse | wire.Undecodable) -> ControllerMessage | None:
        """What the controller sent; an assignment that cannot be read is answered with an error
        here (None: the rest of the worker never sees it)."""
        if isinstance(one, wire.Undecodable):
            log.error("cannot decode a controller message (assignment %r): %s", one.assignment_id, one.reason)
            self._refuse_unreadable(
                one.assignment_id, one.job_ids, f"the worker cannot decode the assignment: {one.reason}"
            )
            return None
        try:
            return wire.from_controller(one)
        except Exception as exc:
            log.exception("cannot read a controller message")
            assignment_id, job_ids = wire.assignment_job_ids(one)
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


# ---- the Outbox: what waits to go up the stream --------------------------------------------------

# A result whose write failed this many times is given up (the controller retries the job
# elsewhere once the lease of this worker's old stream expires).
MAX_RESULT_ATTEMPTS = 5


@dataclass
class OutgoingMessage:
    """One message for the stream; `durable` ones (results) survive reconnects."""

    message: Any
    durable: bool = False
    attempts: int = 0
    job_id: str = ""  # a run's result: findable by `Outbox.waiting_result` until written


class Outbox:
    """A FIFO of outgoing messages with put-back for results that failed to send."""

    def __init__(self) -> None:
        self._items: deque[OutgoingMessage] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._in_flight = 0
        # job id -> its run's result, from put until written or given up (queued or in flight)
        self._results: dict[str, OutgoingMessage] = {}

    def _changed(self) -> None:
        if self._items:
            self._ready.set()
        else:
            self._ready.clear()
        if self._items or self._in_flight:
            self._idle.clear()
        else:
            self._idle.set()

    def put(self, message: Any, *, durable: bool = False, job_id: str = "") -> None:
        """Queue `message` (durable: keep it until it was written; `job_id`: a durable message
        that is the result of that job's run, found by `waiting_result` meanwhile)."""
        item = OutgoingMessage(message, durable or bool(job_id), job_id=job_id)
        self._items.append(item)
        if job_id:
            self._results[job_id] = item
        self._changed()

    def waiting_result(self, job_id: str) -> Any | None:
        """The result of `job_id`'s run while it waits to be written (None once written)."""
        item = self._results.get(job_id)
        return item.message if item is not None else None

    def _settled(self, item: OutgoingMessage) -> None:
        if item.job_id and self._results.get(item.job_id) is item:
            del self._results[item.job_id]

    async def get(self) -> OutgoingMessage:
        """The next message; call `sent` or `failed` with it afterwards."""
        return (await self.get_many(1, 0, len))[0]

    async def get_many(
        self, max_items: int, max_bytes: int, size: Callable[[Any], int]
    ) -> list[OutgoingMessage]:
        """The next message and those queued behind it, up to `max_items` and `max_bytes` in all
        (`size` of each message; the first one is taken whatever its size), in order.

        Call `sent` or `failed` with each afterwards.
        """
        while not self._items:
            await self._ready.wait()
        taken = [self._items.popleft()]
        total = size(taken[0].message) if len(self._items) and max_items > 1 else 0
        while self._items and len(taken) < max_items:
            total += size(self._items[0].message)
            if total > max_bytes:
                break
            taken.append(self._items.popleft())
        self._in_flight += len(taken)
        self._changed()
        return taken

    def sent(self, item: OutgoingMessage) -> None:
        """`item` was written to the stream."""
        self._in_flight -= 1
        self._settled(item)
        self._changed()

    def failed(self, item: OutgoingMessage) -> bool:
        """The write of `item` failed; durable items go back to the front. True when kept.

        For several items of one failed write, call it in reverse order to keep their order.
        """
        self._in_flight -= 1
        item.attempts += 1
        kept = item.durable and item.attempts < MAX_RESULT_ATTEMPTS
        if kept:
            self._items.appendleft(item)
        else:
            self._settled(item)
        self._changed()
        return kept

    def drop_live(self) -> int:
        """Forget events and heartbeats (the stream is down); return how many were dropped."""
        kept = deque(item for item in self._items if item.durable)
        dropped = len(self._items) - len(kept)
        self._items = kept
        self._changed()
        return dropped

    def durable_pending(self) -> int:
        """Results not yet written."""
        return sum(1 for item in self._items if item.durable)

    async def wait_idle(self) -> None:
        """Until everything queued has been written (or dropped)."""
        await self._idle.wait()
