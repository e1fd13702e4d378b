"""Where the open sessions are listed: this controller's memory, and Redis for every controller.

A session is relayed by the controller it was opened on and lives nowhere else; what is shared
is its listing (`ClusterService.ListSessions`). With a Redis store each controller writes a hash
per session it holds, `{prefix}session:{id}` (model, worker, controller, tenant, opened_at,
labels as JSON), with a TTL it renews while the session lasts (`TTL_S`, renewed every
`RENEW_S`): a controller that dies stops renewing and its sessions leave the listing within
`TTL_S`. Redis trouble never touches a session: a failed write or read is logged and the listing
falls back to this controller's own sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("omnirt.controller.realtime.registry")

TTL_S = 30
RENEW_S = 10.0
MAX_LISTED = 10_000


@dataclass
class SessionRecord:
    """One open session as ListSessions shows it."""

    session_id: str
    model: str
    worker_id: str
    controller: str
    tenant: str
    opened_at: float  # Unix time, seconds
    labels: dict[str, str] = field(default_factory=dict)


class RedisSessions:
    """The session hashes on the job store's Redis (see the module docstring)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix + "session:"
        self._held: dict[str, SessionRecord] = {}
        self._renewer: asyncio.Task[None] | None = None

    def _key(self, session_id: str) -> str:
        return self.prefix + session_id

    async def put(self, record: SessionRecord) -> None:
        self._held[record.session_id] = record
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew())
        await self._write(record)

    async def _write(self, record: SessionRecord) -> None:
        mapping = {
            "model": record.model,
            "worker_id": record.worker_id,
            "controller": record.controller,
            "tenant": record.tenant,
            "opened_at": repr(record.opened_at),
            "labels": json.dumps(record.labels),
        }
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hset(self._key(record.session_id), mapping=mapping)
                pipe.expire(self._key(record.session_id), TTL_S)
                await pipe.execute()
        except Exception as exc:  # the listing only: the session goes on
            log.warning("cannot list session %s in Redis: %s", record.session_id, exc)

    async def drop(self, session_id: str) -> None:
        self._held.pop(session_id, None)
        try:
            await self.redis.delete(self._key(session_id))
        except Exception as exc:
            log.warning("cannot unlist session %s in Redis: %s (its entry expires)", session_id, exc)

    async def _renew(self) -> None:
        while self._held:
            await asyncio.sleep(RENEW_S)
            for record in list(self._held.values()):
                await self._write(record)

    async def listed(self) -> list[SessionRecord] | None:
        """Every controller's sessions; None when Redis cannot be read."""
        try:
            keys = []
            async for key in self.redis.scan_iter(match=self.prefix + "*", count=500):
                keys.append(key)
                if len(keys) >= MAX_LISTED:
                    break
            records = []
            for key in keys:
                data = {k.decode(): v.decode() for k, v in (await self.redis.hgetall(key)).items()}
                if not data:
                    continue  # expired between the scan and the read
                session_id = (key.decode() if isinstance(key, bytes) else key)[len(self.prefix) :]
                records.append(
                    SessionRecord(
                        session_id=session_id,
                        model=data.get("model", ""),
                        worker_id=data.get("worker_id", ""),
                        controller=data.get("controller", ""),
                        tenant=data.get("tenant", ""),
                        opened_at=float(data.get("opened_at", "0") or 0),
                        labels=json.loads(data.get("labels", "{}") or "{}"),
                    )
                )
            return records
        except Exception as exc:
            log.warning("cannot read the session listing from Redis: %s", exc)
            return None

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer


def now() -> float:
    return time.time()
