"""Public services: each method translates proto -> engine call -> proto, nothing more.

Every job call is the caller's (`edges.auth.caller()`, set by the gRPC interceptor and by the
HTTP middleware, which calls these servicers too): a submission is owned by the caller's
tenant under its quotas, and reads see only that tenant's jobs (all of them for an admin).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc

from omnirt._internal import convert as c
from omnirt.controller.core.engine_client import EngineClient
from omnirt.controller.edges.auth import caller
from omnirt.errors import InvalidRequest, error_for
from omnirt.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
    types_pb2,
)

CHUNK_BYTES = 1024 * 1024
DEFAULT_PAGE = 100
MAX_PAGE_TOKEN_DIGITS = 9  # offsets below 10**9: more jobs than any store keeps


def _call_deadline_ms(context: grpc.aio.ServicerContext) -> int:
    remaining = context.time_remaining()
    return int((time.time() + remaining) * 1000) if remaining is not None else 0


def _request(msg: types_pb2.GenerateRequest):  # type: ignore[no-untyped-def]
    if msg.task and c.task_from_proto(msg.task) is None:
        raise InvalidRequest(f"task: unknown task number {msg.task}", field="task")
    return c.request_from_proto(msg)


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def Generate(self, request, context):  # type: ignore[no-untyped-def]
        principal = caller()
        job, _ = await self.engine.submit(
            _request(request),
            tenant=principal.tenant,
            policy=principal.policy,
            call_deadline_ms=_call_deadline_ms(context),
        )
        try:
            job = await self.engine.wait(job.id)
        except asyncio.CancelledError:
            # The client went away (cancelled) or its deadline passed (expired): nobody waits any more.
            await asyncio.shield(self.engine.abandon(job.id))
            raise
        if job.result is None or job.error is not None:
            err = job.error
            raise (
                error_for(err.code, err.message, field=err.field)
                if err
                else error_for("UNKNOWN", "no result")
            )
        job_msg = self.engine.job_message(job)
        response = generation_pb2.GenerateResponse(result=job_msg.result)
        job_msg.ClearField("result")  # the result travels once
        response.job.CopyFrom(job_msg)
        return response

    async def Submit(self, request, context):  # type: ignore[no-untyped-def]
        principal = caller()
        job, dedup = await self.engine.submit(
            _request(request.request), tenant=principal.tenant, policy=principal.policy
        )
        return generation_pb2.SubmitResponse(
            job=c.job_to_proto(await self.engine.get(job.id)), deduplicated=dedup
        )

    async def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        job = await self.engine.get(request.job_id, tenant=caller().scope)
        return generation_pb2.GetJobResponse(job=c.job_to_proto(job))

    async def ListJobs(self, request, context):  # type: ignore[no-untyped-def]
        states = [s for s in (c.state_from_proto(v) for v in request.states) if s is not None]
        token = request.page_token or "0"
        # A token is the offset ListJobs gave: a plain decimal within any list's reach.
        if not (token.isascii() and token.isdigit() and len(token) <= MAX_PAGE_TOKEN_DIGITS):
            raise InvalidRequest("page_token: not a token from ListJobs", field="page_token")
        offset = int(token)
        jobs, next_offset = await self.engine.list_jobs(
            states, request.model, request.page_size or DEFAULT_PAGE, offset, tenant=caller().scope
        )
        return generation_pb2.ListJobsResponse(
            jobs=[c.job_to_proto(j) for j in jobs], next_page_token=str(next_offset) if next_offset else ""
        )

    async def WatchJob(self, request, context) -> AsyncIterator[generation_pb2.WatchJobResponse]:  # type: ignore[no-untyped-def]
        events = self.engine.watch(request.job_id, request.after_sequence, tenant=caller().scope)
        async for event in events:
            yield generation_pb2.WatchJobResponse(event=c.event_to_proto(event))

    async def CancelJob(self, request, context):  # type: ignore[no-untyped-def]
        job, cancelled = await self.engine.cancel(request.job_id, tenant=caller().scope)
        return generation_pb2.CancelJobResponse(job=c.job_to_proto(job), cancelled=cancelled)

    async def Validate(self, request, context):  # type: ignore[no-untyped-def]
        plan = self.engine.validate(_request(request.request))
        return generation_pb2.ValidateResponse(
            model=plan.spec.id,
            task=c.task_to_proto(plan.request.task),
            execution_mode=plan.spec.execution_mode,
            config_resolved=c.struct_from_dict(plan.config),
            warnings=plan.warnings,
        )

    async def DownloadArtifact(self, request, context):  # type: ignore[no-untyped-def]
        data, result = await self.engine.artifact(request.job_id, request.index, tenant=caller().scope)
        meta = c.artifact_to_proto(result.artifacts[request.index])
        meta.ClearField("data")
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            first = start == 0
            yield generation_pb2.DownloadArtifactResponse(
                chunk=data[start : start + CHUNK_BYTES], artifact=meta if first else None
            )


class ModelServicer(models_pb2_grpc.ModelServiceServicer):
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def ListModels(self, request, context):  # type: ignore[no-untyped-def]
        specs = self.engine.list_models(c.task_from_proto(request.task))
        return models_pb2.ListModelsResponse(models=[c.model_to_proto(s) for s in specs])

    async def DescribeModel(self, request, context):  # type: ignore[no-untyped-def]
        return models_pb2.DescribeModelResponse(
            model=c.model_to_proto(self.engine.describe_model(request.model))
        )


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def ListWorkers(self, request, context):  # type: ignore[no-untyped-def]
        return cluster_pb2.ListWorkersResponse(
            workers=[c.worker_to_proto(w) for w in await self.engine.list_workers()]
        )

    async def DrainWorker(self, request, context):  # type: ignore[no-untyped-def]
        return cluster_pb2.DrainWorkerResponse(
            worker=c.worker_to_proto(await self.engine.drain_worker(request.worker_id))
        )
