"""`SessionSlots`: the realtime sessions this worker hosts (`--session-slots`, docs/worker.md).

A SessionOffer on Connect starts a `SessionHost` task, which dials its own WorkerSession stream
on the same channel. An offer the worker cannot take (every session slot busy, draining, a
model it does not serve) is still attached and answered with `error` at once, so the
controller does not wait for a timeout. Sessions count as running for a drain: they go on
until `drain_timeout_s`, then are closed (`stop`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from omnirt import types as t
from omnirt._internal.protocol.messages import SessionOffer
from omnirt.worker.assignments import model_refusal
from omnirt.worker.config import WorkerConfig
from omnirt.worker.credentials import WorkerCredentials
from omnirt.worker.modes.executor import Executor
from omnirt.worker.realtime.host import SessionHost

log = logging.getLogger(__name__)


class SessionSlots:
    """Hosts offered sessions up to `--session-slots`; refuses the rest at once.

    `executor` gives the worker's executor; `channel` the Connect stream's channel (None while
    disconnected); `heartbeat` queues a heartbeat (the controller sees a session come and go
    at once); `instance_id` is this process's id, which the controller checks at attach.
    """

    def __init__(
        self,
        config: WorkerConfig,
        credentials: WorkerCredentials,
        instance_id: str,
        executor: Callable[[], Executor],
        channel: Callable[[], grpc.aio.Channel | None],
        heartbeat: Callable[[], None],
    ) -> None:
        self._config = config
        self._credentials = credentials
        self._instance_id = instance_id
        self._executor = executor
        self._channel = channel
        self._heartbeat = heartbeat
        # session id -> its relay, while it runs
        self._sessions: dict[str, SessionHost] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # hosted and refused sessions alike

    @property
    def ids(self) -> list[str]:
        """The ids of the sessions hosted here (for the heartbeat)."""
        return list(self._sessions)

    @property
    def tasks(self) -> list[asyncio.Task[None]]:
        """The sessions' tasks, refusals still being answered included."""
        return list(self._tasks)

    def __len__(self) -> int:
        return len(self._sessions)

    def offer(self, offer: SessionOffer, draining: bool) -> None:
        """Host `offer`, or attach and refuse it at once (slots busy, draining, another model)."""
        if offer.session_id in self._sessions:
            log.info("session %s: offered again while hosted here; ignored", offer.session_id)
            return
        refusal = self._refusal(offer, draining)
        if refusal is not None:
            log.warning("refusing session %s: %s", offer.session_id, refusal.message)
        host = SessionHost(
            offer,
            self._executor(),
            self._channel(),
            worker_id=self._config.worker_id,
            instance_id=self._instance_id,
            token=self._credentials.token,
            metadata=self._credentials.metadata(),
            refusal=refusal,
            model_dir=self._config.model_dir,
            on_release=None if refusal else lambda: self._release(host),
        )
        if refusal is None:
            self._sessions[offer.session_id] = host
        task = asyncio.create_task(self._host(host), name=f"omnirt-session-{offer.session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if refusal is None:
            self._heartbeat()  # the controller sees the session here at once

    def stop(self, reason: str) -> None:
        """Close every hosted session, with `closed` reason `reason`."""
        for host in list(self._sessions.values()):
            host.stop(reason)

    def _refusal(self, offer: SessionOffer, draining: bool) -> t.JobError | None:
        worker_id = self._config.worker_id
        if draining:
            return t.JobError("UNAVAILABLE", f"worker {worker_id} is draining")
        if self._config.session_slots == 0:
            return t.JobError(
                "FAILED_PRECONDITION", f"worker {worker_id} hosts no realtime sessions (--session-slots 0)"
            )
        if len(self._sessions) >= self._config.session_slots:
            return t.JobError(
                "RESOURCE_EXHAUSTED",
                f"worker {worker_id}: all {self._config.session_slots} session slot(s) are busy",
            )
        refusal = model_refusal(self._config, offer.model)
        if refusal is not None:
            return t.JobError(refusal.code, refusal.message, "model")
        return None

    async def _host(self, host: SessionHost) -> None:
        try:
            await host.run()
        except Exception:  # run() answers its own failures; a bug here costs the session alone
            log.exception("session %s failed", host.session_id)
        finally:
            self._release(host)

    def _release(self, host: SessionHost) -> None:
        """`host`'s slot is free (its model session is closed); idempotent."""
        if self._sessions.get(host.session_id) is host:
            del self._sessions[host.session_id]
            self._heartbeat()
