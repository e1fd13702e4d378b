"""`omnirt.v1` catalog and cluster messages (ModelSpec, ModelOutcome, WorkerInfo) <-> `omnirt.types`.

The other half of `omnirt._internal.convert` (requests, results, jobs and events), on the same
primitives (enums through tables, Structs, timestamps).
"""

from __future__ import annotations

from omnirt import types as t
from omnirt._internal import convert as c
from omnirt.v1 import cluster_pb2, models_pb2


def model_to_proto(s: t.ModelSpec) -> models_pb2.ModelSpec:
    d, lim = s.defaults, s.limits
    return models_pb2.ModelSpec(
        id=s.id,
        aliases=s.aliases,
        family=s.family,
        tasks=[c.task_to_proto(x) for x in s.tasks],
        execution_mode=s.execution_mode,
        source=s.source,
        pipeline_class=s.pipeline_class,
        defaults=models_pb2.ModelDefaults(
            width=d.width,
            height=d.height,
            num_frames=d.num_frames,
            fps=d.fps,
            num_inference_steps=d.num_inference_steps,
            guidance_scale=d.guidance_scale,
            scheduler=d.scheduler,
            strength=d.strength,
            duration_ms=d.duration_ms,
        ),
        limits=models_pb2.ModelLimits(
            max_width=lim.max_width,
            max_height=lim.max_height,
            max_num_frames=lim.max_num_frames,
            max_inference_steps=lim.max_inference_steps,
            max_num_outputs=lim.max_num_outputs,
            max_batch_size=lim.max_batch_size,
            max_prompt_chars=lim.max_prompt_chars,
            max_input_bytes=lim.max_input_bytes,
            max_duration_ms=lim.max_duration_ms,
        ),
        supports_batching=s.supports_batching,
        presets=[
            models_pb2.Preset(
                name=p.name, description=p.description, overrides=c.struct_from_dict(p.overrides)
            )
            for p in s.presets
        ],
        description=s.description,
        runtime=c.struct_from_dict(s.runtime),
        serving_workers=s.serving_workers,
        streaming=s.streaming,
        warm_on=[models_pb2.WarmWorker(worker_id=k, memory_bytes=v) for k, v in sorted(s.warm_on.items())],
    )


def model_from_proto(m: models_pb2.ModelSpec) -> t.ModelSpec:
    d, lim = m.defaults, m.limits
    return t.ModelSpec(
        id=m.id,
        aliases=list(m.aliases),
        family=m.family,
        tasks=[x for x in (c.task_from_proto(v) for v in m.tasks) if x is not None],
        execution_mode=m.execution_mode,
        source=m.source,
        pipeline_class=m.pipeline_class,
        defaults=t.ModelDefaults(
            width=d.width,
            height=d.height,
            num_frames=d.num_frames,
            fps=d.fps,
            num_inference_steps=d.num_inference_steps,
            guidance_scale=d.guidance_scale,
            scheduler=d.scheduler,
            strength=d.strength,
            duration_ms=d.duration_ms,
        ),
        limits=t.ModelLimits(
            max_width=lim.max_width,
            max_height=lim.max_height,
            max_num_frames=lim.max_num_frames,
            max_inference_steps=lim.max_inference_steps,
            max_num_outputs=lim.max_num_outputs,
            max_batch_size=lim.max_batch_size,
            max_prompt_chars=lim.max_prompt_chars,
            max_input_bytes=lim.max_input_bytes,
            max_duration_ms=lim.max_duration_ms,
        ),
        supports_batching=m.supports_batching,
        presets=[t.Preset(p.name, p.description, c.dict_from_struct(p.overrides)) for p in m.presets],
        description=m.description,
        runtime=c.dict_from_struct(m.runtime),
        serving_workers=m.serving_workers,
        streaming=m.streaming,
        warm_on={w.worker_id: w.memory_bytes for w in m.warm_on},
    )


def model_outcome_to_proto(o: t.ModelOutcome) -> models_pb2.ModelOutcome:
    msg = models_pb2.ModelOutcome(
        worker_id=o.worker_id,
        loaded=o.loaded,
        load_ms=o.load_ms,
        memory_bytes=o.memory_bytes,
        unchanged=o.unchanged,
    )
    if o.error is not None:
        msg.error.CopyFrom(c.error_to_proto(o.error))
    return msg


def model_outcome_from_proto(m: models_pb2.ModelOutcome) -> t.ModelOutcome:
    return t.ModelOutcome(
        worker_id=m.worker_id,
        loaded=m.loaded,
        error=c.error_from_proto(m.error) if m.HasField("error") else None,
        load_ms=m.load_ms,
        memory_bytes=m.memory_bytes,
        unchanged=m.unchanged,
    )


def worker_to_proto(w: t.WorkerInfo) -> cluster_pb2.WorkerInfo:
    msg = cluster_pb2.WorkerInfo(
        id=w.id,
        state=c.enum_to_proto(cluster_pb2.WorkerState, "WORKER_STATE_", w.state),
        execution_mode=w.execution_mode,
        backend=w.backend,
        models=w.models,
        loaded_models=w.loaded_models,
        slots=w.slots,
        busy_slots=w.busy_slots,
        hostname=w.hostname,
        pid=w.pid,
        version=w.version,
        labels=w.labels,
        running_job_ids=w.running_job_ids,
        unknown_models=w.unknown_models,
        instance_id=w.instance_id,
        step_rows=w.step_rows,
        step_pipelines=w.step_pipelines,
        jobs_succeeded=w.jobs_succeeded,
        jobs_failed=w.jobs_failed,
        device=w.device,
    )
    c.ts_to_proto(w.connected_at, msg.connected_at)
    c.ts_to_proto(w.last_heartbeat_at, msg.last_heartbeat_at)
    return msg


def worker_from_proto(m: cluster_pb2.WorkerInfo) -> t.WorkerInfo:
    return t.WorkerInfo(
        id=m.id,
        state=c.enum_from_proto(cluster_pb2.WorkerState, "WORKER_STATE_", t.WorkerState, m.state),
        execution_mode=m.execution_mode,
        backend=m.backend,
        models=list(m.models),
        loaded_models=list(m.loaded_models),
        slots=m.slots,
        busy_slots=m.busy_slots,
        hostname=m.hostname,
        pid=m.pid,
        version=m.version,
        connected_at=c.ts_from_proto(m, "connected_at"),
        last_heartbeat_at=c.ts_from_proto(m, "last_heartbeat_at"),
        labels=dict(m.labels),
        running_job_ids=list(m.running_job_ids),
        unknown_models=list(m.unknown_models),
        instance_id=m.instance_id,
        step_rows=m.step_rows,
        step_pipelines=list(m.step_pipelines),
        jobs_succeeded=m.jobs_succeeded,
        jobs_failed=m.jobs_failed,
        device=m.device,
    )
