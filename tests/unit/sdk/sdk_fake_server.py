"""A scripted in-process gRPC server speaking `omnirt.v1`, to unit-test the SDK and the CLI.

It is not the controller: it answers with canned jobs, events and statuses (including the
trailing metadata the controller's error interceptor sends), so the client side's mapping,
paging, streaming and output can be checked without a worker or a model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from omnirt import errors
from omnirt._internal import catalog_convert
from omnirt._internal import convert as conv
from omnirt.types import (
    Artifact,
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    MediaKind,
    ModelDefaults,
    ModelLimits,
    ModelOutcome,
    ModelSpec,
    Preset,
    Progress,
    RunReport,
    StageTiming,
    Task,
    WorkerInfo,
)
from omnirt.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"fake image bytes"
T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


def sample_result(job_id: str = "job-1", *, data: bytes = PNG, inline: bool = True) -> GenerateResult:
    """What a 64x64, 4-step tiny-sd run on worker w-1 reports."""
    artifact = Artifact(
        index=0,
        kind=MediaKind.IMAGE,
        mime_type="image/png",
        data=data if inline else b"",
        uri="" if inline else f"omnirt://jobs/{job_id}/artifacts/0",
        size_bytes=len(data),
        sha256="0" * 64,
        width=64,
        height=64,
        seed=42,
        file_name=f"{job_id}-0.png",
    )
    report = RunReport(
        job_id=job_id,
        worker_id="w-1",
        model="tiny-sd",
        task=Task.TEXT2IMAGE,
        backend="cpu",
        execution_mode="legacy_call",
        queue_wait_ms=3.2,
        timings=[StageTiming("load", 812.0), StageTiming("denoise", 150.4)],
        execution_ms=1000.0,
        config_resolved={"width": 64, "height": 64, "num_inference_steps": 4, "seed": 42},
        cold_start=True,
        seeds=[42],
        started_at=T0,
    )
    return GenerateResult(job_id=job_id, artifacts=[artifact], report=report)


def job(job_id: str = "job-1", state: JobState = JobState.QUEUED, **kw: Any) -> Job:
    return Job(id=job_id, state=state, model="tiny-sd", task=Task.TEXT2IMAGE, created_at=T0, **kw)


def success_events(job_id: str = "job-1", result: GenerateResult | None = None) -> list[JobEvent]:
    """queued -> running -> 4 steps -> result -> succeeded."""
    events = [
        JobEvent(job_id, EventKind.STATE, state=JobState.QUEUED, time=T0),
        JobEvent(job_id, EventKind.STATE, state=JobState.RUNNING, worker_id="w-1", time=T0),
        JobEvent(job_id, EventKind.STAGE, stage="denoise", time=T0),
        *(
            JobEvent(job_id, EventKind.PROGRESS, progress=Progress(step, 4, "denoise"), time=T0)
            for step in range(1, 5)
        ),
        JobEvent(job_id, EventKind.STAGE, stage="denoise", stage_finished=True, stage_duration_ms=150.4),
        JobEvent(job_id, EventKind.RESULT, result=result or sample_result(job_id), time=T0),
        JobEvent(job_id, EventKind.STATE, state=JobState.SUCCEEDED, worker_id="w-1", time=T0),
    ]
    for i, event in enumerate(events, start=1):
        event.sequence = i
    return events


def failure_events(job_id: str, state: JobState, error: JobError | None) -> list[JobEvent]:
    return [
        JobEvent(job_id, EventKind.STATE, sequence=1, state=JobState.RUNNING, worker_id="w-1"),
        JobEvent(job_id, EventKind.STATE, sequence=2, state=state, error=error),
    ]


MODELS = [
    ModelSpec(
        id="tiny-sd",
        family="sd",
        tasks=[Task.TEXT2IMAGE],
        source="builtin:tiny-sd",
        pipeline_class="StableDiffusionPipeline",
        aliases=["tiny-stable-diffusion"],
        defaults=ModelDefaults(width=64, height=64, num_inference_steps=4, guidance_scale=7.5),
        limits=ModelLimits(max_width=512, max_height=512, max_batch_size=8),
        supports_batching=True,
        presets=[Preset("fast", "fewest steps", {"num_inference_steps": 2})],
        serving_workers=1,
    ),
    ModelSpec(id="tiny-wan", family="wan", tasks=[Task.TEXT2VIDEO], execution_mode="modular"),
]

WORKERS = [
    WorkerInfo(
        id="w-1",
        execution_mode="legacy_call",
        backend="cpu",
        models=["tiny-sd", "tiny-wan"],
        loaded_models=["tiny-sd"],
        slots=2,
        busy_slots=1,
        hostname="host-a",
        connected_at=T0,
        jobs_succeeded=5,
        jobs_failed=1,
        device="cuda:0,1",
    )
]


@dataclass
class FakeController:
    """The script: what each call answers. Tests change the fields before calling."""

    address: str = ""
    requests: list[GenerateRequest] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    # method name -> the error it fails with
    fail: dict[str, errors.OmniRTError] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    events: dict[str, list[JobEvent]] = field(default_factory=dict)
    result: GenerateResult = field(default_factory=sample_result)
    downloads: dict[tuple[str, int], bytes] = field(default_factory=dict)
    cancelled: bool = True
    # When set, WatchJob blocks after its events until released (or the call ends).
    hold_watch: threading.Event | None = None
    watch_calls: list[tuple[str, int]] = field(default_factory=list)

    def check(self, method: str, context: grpc.ServicerContext) -> None:
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        err = self.fail.get(method)
        if err is not None:
            # What the controller's error interceptor does.
            context.set_trailing_metadata(err.trailing_metadata())
            context.abort(err.code, err.message)


class _Generation(generation_pb2_grpc.GenerationServiceServicer):
    def __init__(self, fake: FakeController) -> None:
        self.fake = fake

    def Generate(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("Generate", context)
        self.fake.requests.append(conv.request_from_proto(request))
        return generation_pb2.GenerateResponse(result=conv.result_to_proto(self.fake.result))

    def Submit(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("Submit", context)
        req = conv.request_from_proto(request.request)
        self.fake.requests.append(req)
        job_id = f"job-{len(self.fake.requests)}"
        submitted = job(job_id, JobState.QUEUED, idempotency_key=req.idempotency_key, queue_position=1)
        self.fake.jobs.setdefault(job_id, submitted)
        self.fake.events.setdefault(job_id, success_events(job_id))
        return generation_pb2.SubmitResponse(job=conv.job_to_proto(submitted))

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("GetJob", context)
        found = self.fake.jobs.get(request.job_id)
        if found is None:
            err = errors.JobNotFound(f"no job {request.job_id!r}")
            context.set_trailing_metadata(err.trailing_metadata())
            context.abort(err.code, err.message)
        return generation_pb2.GetJobResponse(job=conv.job_to_proto(found))

    def ListJobs(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("ListJobs", context)
        wanted = {conv.state_from_proto(s) for s in request.states}
        jobs = [
            j
            for j in self.fake.jobs.values()
            if (not wanted or j.state in wanted) and (not request.model or j.model == request.model)
        ]
        start = int(request.page_token or 0)
        size = request.page_size or 2  # a small server default, so paging is exercised
        page = jobs[start : start + size]
        token = str(start + size) if start + size < len(jobs) else ""
        return generation_pb2.ListJobsResponse(
            jobs=[conv.job_to_proto(j) for j in page], next_page_token=token
        )

    def WatchJob(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.check("WatchJob", context)
        self.fake.watch_calls.append((request.job_id, request.after_sequence))
        for event in self.fake.events.get(request.job_id, []):
            if event.sequence > request.after_sequence:
                yield generation_pb2.WatchJobResponse(event=conv.event_to_proto(event))
        if self.fake.hold_watch is not None:
            while context.is_active() and not self.fake.hold_watch.wait(0.05):
                pass

    def CancelJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("CancelJob", context)
        state = JobState.CANCELLED if self.fake.cancelled else JobState.SUCCEEDED
        found = job(request.job_id, state)
        return generation_pb2.CancelJobResponse(job=conv.job_to_proto(found), cancelled=self.fake.cancelled)

    def Validate(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("Validate", context)
        req = conv.request_from_proto(request.request)
        self.fake.requests.append(req)
        return generation_pb2.ValidateResponse(
            model="tiny-sd",
            task=conv.task_to_proto(req.task or Task.TEXT2IMAGE),  # as the controller: the model's first task
            execution_mode="legacy_call",
            config_resolved=conv.struct_from_dict({"width": req.width or 64, "num_inference_steps": 4}),
            warnings=["guidance_scale ignored"],
        )

    def DownloadArtifact(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.fake.check("DownloadArtifact", context)
        data = self.fake.downloads[(request.job_id, request.index)]
        for start in range(0, len(data), 5):
            yield generation_pb2.DownloadArtifactResponse(chunk=data[start : start + 5])

    def GetWebhookSecret(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("GetWebhookSecret", context)
        tenant = request.tenant or "default"
        return generation_pb2.GetWebhookSecretResponse(secret=f"whsec_{tenant}", tenant=tenant)


class _Models(models_pb2_grpc.ModelServiceServicer):
    def __init__(self, fake: FakeController) -> None:
        self.fake = fake

    def ListModels(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("ListModels", context)
        task = conv.task_from_proto(request.task)
        models = [m for m in MODELS if task is None or task in m.tasks]
        return models_pb2.ListModelsResponse(models=[catalog_convert.model_to_proto(m) for m in models])

    def DescribeModel(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("DescribeModel", context)
        for m in MODELS:
            if request.model in (m.id, *m.aliases):
                return models_pb2.DescribeModelResponse(model=catalog_convert.model_to_proto(m))
        err = errors.ModelNotFound(f"unknown model {request.model!r} (did you mean 'tiny-sd'?)")
        context.set_trailing_metadata(err.trailing_metadata())
        context.abort(err.code, err.message)

    def LoadModel(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("LoadModel", context)
        outcome = ModelOutcome("w-1", loaded=True, load_ms=12.5, memory_bytes=1 << 20)
        return models_pb2.LoadModelResponse(outcomes=[catalog_convert.model_outcome_to_proto(outcome)])

    def UnloadModel(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("UnloadModel", context)
        outcome = ModelOutcome("w-1", unchanged=True)
        return models_pb2.UnloadModelResponse(outcomes=[catalog_convert.model_outcome_to_proto(outcome)])


class _Cluster(cluster_pb2_grpc.ClusterServiceServicer):
    def __init__(self, fake: FakeController) -> None:
        self.fake = fake

    def ListWorkers(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("ListWorkers", context)
        return cluster_pb2.ListWorkersResponse(workers=[catalog_convert.worker_to_proto(w) for w in WORKERS])

    def DrainWorker(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("DrainWorker", context)
        return cluster_pb2.DrainWorkerResponse(worker=catalog_convert.worker_to_proto(WORKERS[0]))

    def ListSessions(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.fake.check("ListSessions", context)
        session = cluster_pb2.SessionInfo(
            session_id="s-1", model="tiny-talking-head", worker_id="w-1", tenant="acme", labels={"a": "b"}
        )
        session.opened_at.FromDatetime(T0)
        wanted = [session] if request.model in ("", session.model) else []
        return cluster_pb2.ListSessionsResponse(sessions=wanted)


def start(fake: FakeController) -> grpc.Server:
    """Serve `fake` on a free loopback port and set `fake.address`."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)],
    )
    generation_pb2_grpc.add_GenerationServiceServicer_to_server(_Generation(fake), server)
    models_pb2_grpc.add_ModelServiceServicer_to_server(_Models(fake), server)
    cluster_pb2_grpc.add_ClusterServiceServicer_to_server(_Cluster(fake), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    fake.address = f"127.0.0.1:{port}"
    return server
