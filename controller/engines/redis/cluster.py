"""The workers of every controller that shares one Redis, as this controller sees them.

A worker connects to one controller, but any controller lists, counts and drains it. Each
controller claims its workers' ids in Redis (one live process per id across the controllers,
see `upkeep_scripts.CLAIM_WORKER`) and lists them for the others, renewed every upkeep tick; the
others' workers are read back as they last listed them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import redis.exceptions

from omnirt.controller.core.router import WorkerHandle, WorkerRegistry, id_taken
from omnirt.controller.engines.redis.store import RedisJobStore
from omnirt.errors import OmniRTError
from omnirt.types import ModelSpec, WorkerInfo, WorkerState

log = logging.getLogger("omnirt.controller")


def _now_ms() -> int:
    return int(time.time() * 1000)


class Cluster:
    """This controller's workers in Redis (their ids' claims, their listing), and the others'."""

    def __init__(
        self,
        store: RedisJobStore,
        controller_id: str,
        workers: WorkerRegistry,
        lease_timeout_ms: int,
        renew_s: float,
    ) -> None:
        """`renew_s`: how often the upkeep calls `publish` (which renews the claims)."""
        self.store = store
        self.controller_id = controller_id
        self.workers = workers
        self.lease_ms = lease_timeout_ms
        self.renew_s = renew_s
        self.seen: list[WorkerInfo] = []  # every controller's workers, as last read

    def claim_ms(self) -> int:
        """How long a worker id's claim lives past its last renewal: a lease, and at least three
        renewals (a shorter life would lapse between renewals and let a retrying twin in, and the
        two would then take the id from each other in turn)."""
        return max(self.lease_ms, int(3000 * self.renew_s))

    async def claim(self, info: WorkerInfo) -> None:
        """Take worker id `info.id` for its process: AlreadyExists while another live process holds
        it, here or on another controller (the claim in Redis decides, in one script). Not checked
        while Redis is away: the next `publish` claims it."""
        try:
            holder = await self.store.claim_worker(info, self.controller_id, self.claim_ms())
        except redis.exceptions.RedisError:
            return
        if holder is not None:
            raise id_taken(dataclasses.replace(info, hostname=holder[0], pid=holder[1]))

    async def listed(self, handle: WorkerHandle) -> None:
        """List a worker that just connected for the others (while Redis is away: at the next
        `publish`)."""
        with contextlib.suppress(redis.exceptions.RedisError):
            await self.store.put_workers(
                [handle.snapshot()], self.controller_id, self.claim_ms(), _now_ms() + self.lease_ms
            )

    async def publish(self) -> None:
        """Every upkeep tick: renew the claims of this controller's workers and list them for the
        cluster, then read every controller's workers.

        A worker whose id another process holds now (its claim expired while Redis was away or
        this controller stalled, and that one took it) is disconnected: the engine requeues its
        jobs, and it is refused when it comes back while the other lives."""
        handles = self.workers.all()
        lost = await self.store.put_workers(
            [w.snapshot() for w in handles], self.controller_id, self.claim_ms(), _now_ms() + self.lease_ms
        )
        for handle in handles:
            if handle.id in lost:
                log.warning(
                    "worker id taken by another process: disconnecting", extra={"worker_id": handle.id}
                )
                handle.link.close()
        self.seen = await self.store.workers(_now_ms())

    async def dropped(self, handle: WorkerHandle) -> None:
        """Forget a worker that left (its claim and listing), unless another process holds its id."""
        with contextlib.suppress(redis.exceptions.RedisError):
            await self.store.drop_worker(handle.info, self.controller_id)

    async def listing(self) -> list[WorkerInfo]:
        """Every controller's workers by id: this one's now, the others' as last listed."""
        local = [w.snapshot() for w in self.workers.all()]
        ids = {w.id for w in local}
        with contextlib.suppress(redis.exceptions.RedisError):
            self.seen = await self.store.workers(_now_ms())
        return sorted(local + [w for w in self.seen if w.id not in ids], key=lambda w: w.id)

    async def drain(self, worker_id: str) -> WorkerInfo:
        """Drain a worker: this controller's at once, another's through Redis (its controller
        hears it, see `RedisUpkeep._on_message`); WorkerNotFound for an id nobody has."""
        with contextlib.suppress(OmniRTError):
            handle = self.workers.get(worker_id)
            handle.drain()
            return handle.snapshot()
        for info in await self.listing():
            if info.id == worker_id:
                await self.store.publish(f"d {worker_id}")
                info.state = WorkerState.DRAINING
                return info
        return self.workers.get(worker_id).snapshot()  # raises WorkerNotFound

    def serving(self, spec: ModelSpec, backend: str = "") -> int:
        """Workers serving `spec` (on `backend`, when given) on any controller (this one's now,
        the others' as last seen)."""
        local = {w.id for w in self.workers.candidates(spec, backend)}
        here = {w.id for w in self.workers.all()}
        remote = {
            w.id
            for w in self.seen
            if w.id not in here
            and w.execution_mode == spec.execution_mode
            and (not w.models or spec.id in w.models)
            and (not backend or w.backend == backend)
            and w.state is WorkerState.READY
        }
        return len(local | remote)

    def warm_on(self, spec: ModelSpec, local: dict[str, int]) -> dict[str, int]:
        """Where `spec` is loaded: `local` (this controller's workers, with the bytes they
        measure), and other controllers' workers as last seen (where, not how many bytes: 0)."""
        remote = {w.id: 0 for w in self.seen if w.id not in local and spec.id in w.loaded_models}
        return {**remote, **local}
