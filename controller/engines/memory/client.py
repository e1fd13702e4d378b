"""`MemoryEngineClient`: the `EngineClient` over the in-process `Engine` (the default engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from omnirt._internal.protocol.messages import ModelLoaded
from omnirt.controller.core.encoded import ResultEncoding
from omnirt.controller.core.router import WorkerHandle, WorkerLink
from omnirt.controller.core.tenants import UNLIMITED, TenantPolicy
from omnirt.controller.core.validation import Plan
from omnirt.controller.engines.memory.engine import Engine
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


class MemoryEngineClient:
    """`EngineClient` over the in-process `Engine` (nothing here waits on I/O)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.config = engine.config
        self.catalog = engine.catalog
        self.metrics = engine.metrics

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        await self.engine.stop()

    def ready(self) -> bool:
        return True

    def validate(self, request: GenerateRequest) -> Plan:
        return self.engine.validate(request)

    async def submit(
        self,
        request: GenerateRequest,
        *,
        tenant: str = "",
        policy: TenantPolicy = UNLIMITED,
        call_deadline_ms: int = 0,
    ) -> tuple[Job, bool]:
        record, deduplicated = self.engine.submit(
            request, tenant=tenant, policy=policy, call_deadline_ms=call_deadline_ms
        )
        return record.job, deduplicated

    async def wait(self, job_id: str) -> Job:
        return (await self.engine.wait(self.engine.store.get(job_id))).job

    async def get(self, job_id: str, *, tenant: str | None = None) -> Job:
        return self.engine.get(job_id, tenant=tenant)

    async def request_of(self, job_id: str, *, tenant: str | None = None) -> GenerateRequest:
        return self.engine.record(job_id, tenant=tenant).plan.request

    async def list_jobs(
        self, states: list[JobState], model: str, limit: int, offset: int, *, tenant: str | None = None
    ) -> tuple[list[Job], int]:
        return self.engine.list_jobs(states, model, limit, offset, tenant=tenant)

    def watch(
        self, job_id: str, after_sequence: int = 0, *, tenant: str | None = None
    ) -> AsyncIterator[JobEvent]:
        return self.engine.watch(job_id, after_sequence, tenant=tenant)

    async def cancel(self, job_id: str, *, tenant: str | None = None) -> tuple[Job, bool]:
        return self.engine.cancel(job_id, tenant=tenant)

    async def abandon(self, job_id: str) -> None:
        self.engine.abandon(job_id)

    async def artifact(
        self, job_id: str, index: int, *, tenant: str | None = None
    ) -> tuple[bytes, GenerateResult]:
        return self.engine.artifact(job_id, index, tenant=tenant)

    def list_models(self, task: Task | None = None) -> list[ModelSpec]:
        return self.engine.list_models(task)

    def describe_model(self, name: str) -> ModelSpec:
        return self.engine.describe_model(name)

    async def list_workers(self) -> list[WorkerInfo]:
        return self.engine.list_workers()

    async def drain_worker(self, worker_id: str) -> WorkerInfo:
        return self.engine.drain_worker(worker_id)

    async def load_model(
        self, name: str, workers: int, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.engine.model_loads.load(name, workers, worker_ids, wait_s)

    async def unload_model(
        self, name: str, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        return await self.engine.model_loads.unload(name, worker_ids, wait_s)

    async def worker_model_answer(self, handle: WorkerHandle, answer: ModelLoaded) -> None:
        self.engine.model_loads.answered(handle, answer)

    async def worker_connected(self, info: WorkerInfo, link: WorkerLink) -> WorkerHandle:
        return self.engine.worker_connected(info, link)

    async def worker_heartbeat(
        self,
        handle: WorkerHandle,
        loaded_models: list[str],
        draining: bool,
        running: set[tuple[str, str]] | None = None,
        model_bytes: dict[str, int] | None = None,
    ) -> None:
        self.engine.worker_heartbeat(handle, loaded_models, draining, running, model_bytes)

    async def worker_event(self, handle: WorkerHandle, assignment_id: str, event: JobEvent) -> None:
        self.engine.worker_event(handle, assignment_id, event)

    async def worker_result(
        self,
        handle: WorkerHandle,
        assignment_id: str,
        job_id: str,
        result: GenerateResult | None,
        error: JobError | None,
        encoding: ResultEncoding | None = None,
    ) -> None:
        self.engine.worker_result(handle, assignment_id, job_id, result, error, encoding)

    async def worker_lost(self, handle: WorkerHandle, reason: str) -> None:
        self.engine.worker_lost(handle, reason)
