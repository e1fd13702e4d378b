"""Public services: each method translates proto -> engine call -> proto, nothing more.

Every job call is the caller's (`edges.auth.caller()`, set by the gRPC interceptor and by the
HTTP middleware, which calls these servicers too): a submission is owned by the caller's
tenant under its quotas, and reads see only that tenant's jobs (all of them for an admin).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from omnirt._internal import catalog_convert
from omnirt._internal import convert as c
from omnirt.controller.core.artifact_store import ArtifactStore, object_chunks
from omnirt.controller.core.bounds import check_id, echo
from omnirt.controller.core.encoded import EncodedJob, EncodedJobs
from omnirt.controller.core.engine_client import EngineClient
from omnirt.controller.edges.auth import TENANT_RE, caller
from omnirt.controller.realtime.manager import SessionManager
from omnirt.controller.webhooks.dispatcher import WebhookDispatcher
from omnirt.errors import InvalidRequest, PermissionDenied, error_for
from omnirt.types import GenerateRequest, Job
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


def _call_deadline_ms(context: grpc.aio.ServicerContext[Any, Any]) -> int:
    remaining = context.time_remaining()
    return int((time.time() + remaining) * 1000) if remaining is not None else 0


def _request(msg: types_pb2.GenerateRequest) -> GenerateRequest:
    if msg.task and c.task_from_proto(msg.task) is None:
        raise InvalidRequest(f"task: unknown task number {msg.task}", field="task")
    known = types_pb2.WebhookEvent.values()
    for i, number in enumerate(msg.webhook.events):
        if number not in known or number == types_pb2.WEBHOOK_EVENT_UNSPECIFIED:
            names = ", ".join(
                n.removeprefix("WEBHOOK_EVENT_").lower() for n in types_pb2.WebhookEvent.keys()[1:]
            )
            raise InvalidRequest(
                f"webhook.events[{i}]: unknown event number {number} (known: {names})", field="webhook.events"
            )
    return c.request_from_proto(msg)


class GenerationServicer(generation_pb2_grpc.GenerationServiceServicer):
    """GenerationService over an engine.

    `encoded` is where finished jobs are kept encoded (the memory store): Generate answers from
    those bytes instead of converting the job again; without it the job is converted.
    """

    def __init__(
        self,
        engine: EngineClient,
        encoded: EncodedJobs | None = None,
        artifacts: ArtifactStore | None = None,
        webhooks: WebhookDispatcher | None = None,
    ) -> None:
        self.engine = engine
        self.encoded = encoded
        self.artifacts = artifacts  # --artifact-store: where workers' objects are read from
        self.webhooks = webhooks

    async def _submit(self, req: GenerateRequest, call_deadline_ms: int = 0) -> tuple[Job, bool]:
        """Submit as the caller; a webhook's address is checked first and followed after."""
        principal = caller()
        if req.webhook is not None:
            if self.webhooks is None:
                raise InvalidRequest("webhook: this controller delivers no webhooks", field="webhook")
            await self.webhooks.check(req.webhook)
        job, dedup = await self.engine.submit(
            req, tenant=principal.tenant, policy=principal.policy, call_deadline_ms=call_deadline_ms
        )
        if req.webhook is not None and not dedup and self.webhooks is not None:
            # The validated request's webhook (its events deduplicated, its interval resolved).
            webhook = (await self.engine.request_of(job.id)).webhook or req.webhook
            await self.webhooks.follow(job.id, principal.tenant, webhook)
        return job, dedup

    async def Generate(
        self,
        request: types_pb2.GenerateRequest,
        context: grpc.aio.ServicerContext[types_pb2.GenerateRequest, generation_pb2.GenerateResponse],
    ) -> generation_pb2.GenerateResponse:
        job, _ = await self._submit(_request(request), _call_deadline_ms(context))
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
        # The result travels once: in `result`, not in `job` too.
        return generate_response(job, self.encoded.encoded(job) if self.encoded is not None else None)

    async def Submit(
        self,
        request: generation_pb2.SubmitRequest,
        context: grpc.aio.ServicerContext[generation_pb2.SubmitRequest, generation_pb2.SubmitResponse],
    ) -> generation_pb2.SubmitResponse:
        job, dedup = await self._submit(_request(request.request))
        return generation_pb2.SubmitResponse(
            job=c.job_to_proto(await self.engine.get(job.id)), deduplicated=dedup
        )

    async def GetJob(
        self,
        request: generation_pb2.GetJobRequest,
        context: grpc.aio.ServicerContext[generation_pb2.GetJobRequest, generation_pb2.GetJobResponse],
    ) -> generation_pb2.GetJobResponse:
        job = await self.engine.get(request.job_id, tenant=caller().scope)
        return generation_pb2.GetJobResponse(job=c.job_to_proto(job))

    async def ListJobs(
        self,
        request: generation_pb2.ListJobsRequest,
        context: grpc.aio.ServicerContext[generation_pb2.ListJobsRequest, generation_pb2.ListJobsResponse],
    ) -> generation_pb2.ListJobsResponse:
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

    async def WatchJob(
        self,
        request: generation_pb2.WatchJobRequest,
        context: grpc.aio.ServicerContext[generation_pb2.WatchJobRequest, generation_pb2.WatchJobResponse],
    ) -> AsyncIterator[generation_pb2.WatchJobResponse]:
        events = self.engine.watch(request.job_id, request.after_sequence, tenant=caller().scope)
        async for event in events:
            yield generation_pb2.WatchJobResponse(event=c.event_to_proto(event))

    async def CancelJob(
        self,
        request: generation_pb2.CancelJobRequest,
        context: grpc.aio.ServicerContext[generation_pb2.CancelJobRequest, generation_pb2.CancelJobResponse],
    ) -> generation_pb2.CancelJobResponse:
        job, cancelled = await self.engine.cancel(request.job_id, tenant=caller().scope)
        return generation_pb2.CancelJobResponse(job=c.job_to_proto(job), cancelled=cancelled)

    async def Validate(
        self,
        request: generation_pb2.ValidateRequest,
        context: grpc.aio.ServicerContext[generation_pb2.ValidateRequest, generation_pb2.ValidateResponse],
    ) -> generation_pb2.ValidateResponse:
        req = _request(request.request)
        if req.webhook is not None and self.webhooks is not None:
            await self.webhooks.check(req.webhook)
        plan = self.engine.validate(req)
        return generation_pb2.ValidateResponse(
            model=plan.spec.id,
            task=c.task_to_proto(plan.request.task),
            execution_mode=plan.spec.execution_mode,
            config_resolved=c.struct_from_dict(plan.config),
            warnings=plan.warnings,
        )

    async def DownloadArtifact(
        self,
        request: generation_pb2.DownloadArtifactRequest,
        context: grpc.aio.ServicerContext[
            generation_pb2.DownloadArtifactRequest, generation_pb2.DownloadArtifactResponse
        ],
    ) -> AsyncIterator[generation_pb2.DownloadArtifactResponse]:
        data, result = await self.engine.artifact(request.job_id, request.index, tenant=caller().scope)
        artifact = result.artifacts[request.index]
        meta = c.artifact_to_proto(artifact)
        meta.ClearField("data")
        if artifact.object_uri and not data:  # in the object store: relayed chunk by chunk
            first = True
            async for chunk in object_chunks(self.artifacts, request.job_id, artifact.object_uri):
                yield generation_pb2.DownloadArtifactResponse(chunk=chunk, artifact=meta if first else None)
                first = False
            if first:  # an empty object: the metadata still comes
                yield generation_pb2.DownloadArtifactResponse(artifact=meta)
            return
        for start in range(0, max(len(data), 1), CHUNK_BYTES):
            first = start == 0
            yield generation_pb2.DownloadArtifactResponse(
                chunk=data[start : start + CHUNK_BYTES], artifact=meta if first else None
            )

    async def GetWebhookSecret(
        self,
        request: generation_pb2.GetWebhookSecretRequest,
        context: grpc.aio.ServicerContext[
            generation_pb2.GetWebhookSecretRequest, generation_pb2.GetWebhookSecretResponse
        ],
    ) -> generation_pb2.GetWebhookSecretResponse:
        principal = caller()
        tenant = request.tenant or principal.tenant
        if request.tenant and not TENANT_RE.fullmatch(request.tenant):
            raise InvalidRequest(
                f"tenant: 1-64 letters, digits, '.', '_' or '-' (got {echo(request.tenant)})", field="tenant"
            )
        if tenant != principal.tenant and not principal.is_admin:
            raise PermissionDenied(f"the webhook secret of tenant {echo(tenant)} needs an admin key")
        if self.webhooks is None:
            raise InvalidRequest("this controller delivers no webhooks", field="tenant")
        return generation_pb2.GetWebhookSecretResponse(
            secret=await self.webhooks.secret(tenant), tenant=tenant
        )


class ModelServicer(models_pb2_grpc.ModelServiceServicer):
    """ModelService: the catalog, with how many workers serve each model and where it is warm;
    LoadModel / UnloadModel (admin) warm or free a model on the workers connected here."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    async def ListModels(
        self,
        request: models_pb2.ListModelsRequest,
        context: grpc.aio.ServicerContext[models_pb2.ListModelsRequest, models_pb2.ListModelsResponse],
    ) -> models_pb2.ListModelsResponse:
        specs = self.engine.list_models(c.task_from_proto(request.task))
        return models_pb2.ListModelsResponse(models=[catalog_convert.model_to_proto(s) for s in specs])

    async def DescribeModel(
        self,
        request: models_pb2.DescribeModelRequest,
        context: grpc.aio.ServicerContext[models_pb2.DescribeModelRequest, models_pb2.DescribeModelResponse],
    ) -> models_pb2.DescribeModelResponse:
        return models_pb2.DescribeModelResponse(
            model=catalog_convert.model_to_proto(self.engine.describe_model(request.model))
        )

    async def LoadModel(
        self,
        request: models_pb2.LoadModelRequest,
        context: grpc.aio.ServicerContext[models_pb2.LoadModelRequest, models_pb2.LoadModelResponse],
    ) -> models_pb2.LoadModelResponse:
        spec, outcomes = await self.engine.load_model(
            request.model, request.workers, list(request.worker_ids), context.time_remaining()
        )
        return models_pb2.LoadModelResponse(
            model=spec.id, outcomes=[catalog_convert.model_outcome_to_proto(o) for o in outcomes]
        )

    async def UnloadModel(
        self,
        request: models_pb2.UnloadModelRequest,
        context: grpc.aio.ServicerContext[models_pb2.UnloadModelRequest, models_pb2.UnloadModelResponse],
    ) -> models_pb2.UnloadModelResponse:
        spec, outcomes = await self.engine.unload_model(
            request.model, list(request.worker_ids), context.time_remaining()
        )
        return models_pb2.UnloadModelResponse(
            model=spec.id, outcomes=[catalog_convert.model_outcome_to_proto(o) for o in outcomes]
        )


class ClusterServicer(cluster_pb2_grpc.ClusterServiceServicer):
    """ClusterService: the workers of the cluster, and draining one."""

    def __init__(self, engine: EngineClient, sessions: SessionManager | None = None) -> None:
        self.engine = engine
        self.sessions = sessions

    async def ListSessions(
        self,
        request: cluster_pb2.ListSessionsRequest,
        context: grpc.aio.ServicerContext[cluster_pb2.ListSessionsRequest, cluster_pb2.ListSessionsResponse],
    ) -> cluster_pb2.ListSessionsResponse:
        check_id("model", request.model)
        records = await self.sessions.listed(request.model) if self.sessions is not None else []
        answer = cluster_pb2.ListSessionsResponse()
        for r in records:
            info = answer.sessions.add(
                session_id=r.session_id, model=r.model, worker_id=r.worker_id, controller=r.controller,
                tenant=r.tenant, labels=r.labels,
            )  # fmt: skip
            info.opened_at.FromNanoseconds(int(r.opened_at * 1e9))
        return answer

    async def ListWorkers(
        self,
        request: cluster_pb2.ListWorkersRequest,
        context: grpc.aio.ServicerContext[cluster_pb2.ListWorkersRequest, cluster_pb2.ListWorkersResponse],
    ) -> cluster_pb2.ListWorkersResponse:
        return cluster_pb2.ListWorkersResponse(
            workers=[catalog_convert.worker_to_proto(w) for w in await self.engine.list_workers()]
        )

    async def DrainWorker(
        self,
        request: cluster_pb2.DrainWorkerRequest,
        context: grpc.aio.ServicerContext[cluster_pb2.DrainWorkerRequest, cluster_pb2.DrainWorkerResponse],
    ) -> cluster_pb2.DrainWorkerResponse:
        return cluster_pb2.DrainWorkerResponse(
            worker=catalog_convert.worker_to_proto(await self.engine.drain_worker(request.worker_id))
        )


def generate_response(job: Job, encoded: EncodedJob | None) -> generation_pb2.GenerateResponse:
    """A final job's GenerateResponse: parsed from the store's bytes when it has them (straight
    into the answer's fields, no copy of the result between), else converted from `job`."""
    response = generation_pb2.GenerateResponse()
    if encoded is None:
        response.job.CopyFrom(c.job_to_proto(job, with_result=False))
        if job.result is not None:
            response.result.CopyFrom(c.result_to_proto(job.result))
        return response
    response.job.MergeFromString(encoded.job)
    if encoded.result is not None:
        response.result.MergeFromString(encoded.result)
    return response
