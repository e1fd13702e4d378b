"""The one interface the edges (gRPC servicers, worker gateway, HTTP) use to reach an engine.

Two engines implement it: `engines.memory.engine.MemoryEngine` (jobs in this process's memory,
the default) and `engines.redis.engine.RedisEngine` (jobs, queue and events in Redis, so several
controllers share them and a restart loses nothing). The edges never know which one they talk
to. Everything here is `omnirt.types` dataclasses: no protobuf crosses this interface. What the
server wires beside it (the metrics, the memory engine's encoded fast path, the Redis connection
that other parts share) comes from `engines.make_engine`, never from probing behind it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NamedTuple, Protocol

from omnirt._internal.protocol.messages import ModelLoaded
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.router import WorkerHandle, WorkerLink
from omnirt.controller.core.tenants import UNLIMITED, TenantPolicy
from omnirt.controller.core.validation import Plan
from omnirt.types import (
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    ModelOutcome,
    ModelSpec,
    Task,
    WorkerInfo,
)


class SharedRedis(NamedTuple):
    """The Redis client and key prefix the engine keeps its jobs under.

    For what other parts keep beside the jobs: realtime sessions, webhook follows.
    """

    client: Any  # a redis.asyncio.Redis (core imports no client library)
    prefix: str


class EngineClient(Protocol):
    """What the edges call; every job operation is async (a store may be remote)."""

    config: ControllerConfig
    catalog: Catalog

    async def start(self) -> None:
        """Start the engine's own tasks (dispatch, leases, deadlines; Redis upkeep)."""
        ...

    async def stop(self) -> None:
        """Stop those tasks and close every worker's link."""
        ...

    def ready(self) -> bool:
        """False while the job store cannot be reached (health reports NOT_SERVING)."""
        ...

    def validate(self, request: GenerateRequest) -> Plan:
        """The request checked against the catalog and resolved (InvalidRequest, ModelNotFound)."""
        ...

    async def submit(
        self,
        request: GenerateRequest,
        *,
        tenant: str = "",
        policy: TenantPolicy = UNLIMITED,
        call_deadline_ms: int = 0,
    ) -> tuple[Job, bool]:
        """Queue a job owned by `tenant`; returns it and whether an idempotency key matched.

        Idempotency keys are per tenant. After validation and the idempotency lookup (a
        deduplicated submission costs nothing) `policy`'s quotas apply: QuotaExceeded past
        `max_queued` (the tenant's jobs queued or running) or `rate_per_s` (a token bucket of
        `burst`). Jobs of a non-empty tenant share the queue fairly by `policy.weight`.
        """
        ...

    async def wait(self, job_id: str) -> Job:
        """The job once it is final."""
        ...

    # The reads below take `tenant`: None = any tenant (admins, auth off); a string = the job
    # must be that tenant's, else the very JobNotFound an unknown id gets (no existence oracle).
    async def get(self, job_id: str, *, tenant: str | None = None) -> Job:
        """The job as clients see it (with queue position and waiting reason when queued)."""
        ...

    async def request_of(self, job_id: str, *, tenant: str | None = None) -> GenerateRequest:
        """The request the job runs (as validated, with its effective deadline)."""
        ...

    async def list_jobs(
        self, states: list[JobState], model: str, limit: int, offset: int, *, tenant: str | None = None
    ) -> tuple[list[Job], int]:
        """Jobs newest first, filtered by state and model; the page and the next offset (0: no more)."""
        ...

    def watch(
        self, job_id: str, after_sequence: int = 0, *, tenant: str | None = None
    ) -> AsyncIterator[JobEvent]:
        """The job's events after `after_sequence`, live, until its final state event."""
        ...

    async def cancel(self, job_id: str, *, tenant: str | None = None) -> tuple[Job, bool]:
        """Cancel a queued or running job; returns it and False when it was final already."""
        ...

    async def abandon(self, job_id: str) -> None:
        """The client of a Generate went away: past its deadline the job expires, else it is cancelled."""
        ...

    async def artifact(
        self, job_id: str, index: int, *, tenant: str | None = None
    ) -> tuple[bytes, GenerateResult]:
        """The full bytes of one artifact of a succeeded job, and the job's result."""
        ...

    def list_models(self, task: Task | None = None) -> list[ModelSpec]:
        """The catalog's models (those of `task`), with how many workers serve each."""
        ...

    def describe_model(self, name: str) -> ModelSpec:
        """One model by id or alias (ModelNotFound), with how many workers serve it."""
        ...

    async def list_workers(self) -> list[WorkerInfo]:
        """The workers connected to this controller (and, on Redis, to the others)."""
        ...

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        """Let the worker finish its jobs and take no new ones (WorkerNotFound)."""
        ...

    async def load_model(
        self, name: str, workers: int, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        """Make a model warm on `workers` workers connected here that can serve it.

        0 = all of them (of `worker_ids` when given); waits up to `wait_s` for the loads and
        returns the model and one outcome per worker (`core.model_loads.ModelLoads.load`).
        """
        ...

    async def unload_model(
        self, name: str, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        """Free a model on `worker_ids` (empty: every worker connected here that serves it).

        Each frees it once no job of it runs there; waits up to `wait_s` and returns the model
        and one outcome per worker.
        """
        ...

    # the worker gateway
    async def worker_connected(self, info: WorkerInfo, link: WorkerLink) -> WorkerHandle:
        """Register a worker that said Hello (AlreadyExists while another process holds its id)."""
        ...

    async def worker_heartbeat(
        self,
        handle: WorkerHandle,
        loaded_models: list[str],
        draining: bool,
        running: set[tuple[str, str]] | None = None,
        model_bytes: dict[str, int] | None = None,
    ) -> None:
        """A worker's heartbeat.

        `running` is the (job id, assignment id) pairs the worker holds, when it lists them: a
        job counted there that it leaves out is released and requeued. `model_bytes`: the bytes
        of each loaded model the worker measures (ListModels' `warm_on`).
        """
        ...

    async def worker_model_answer(self, handle: WorkerHandle, answer: ModelLoaded) -> None:
        """A worker's answer to a LoadModel or UnloadModel (an answer nobody waits for is ignored)."""
        ...

    async def worker_event(self, handle: WorkerHandle, assignment_id: str, event: JobEvent) -> None:
        """A running job's progress, stage, preview or log event (state changes are the engine's)."""
        ...

    async def worker_result(
        self,
        handle: WorkerHandle,
        assignment_id: str,
        job_id: str,
        result: GenerateResult | None,
        error: JobError | None,
    ) -> None:
        """A job's outcome: its result or its error (a late or foreign one is ignored)."""
        ...

    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None:
        """The worker's stream ended: its jobs are requeued (or failed when attempts are spent)."""
        ...
