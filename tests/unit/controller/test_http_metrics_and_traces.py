"""What /metrics and the traces show, fed by an in-process engine's real life cycle."""

from __future__ import annotations

import re

import pytest
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from omnirt.controller.engines.memory.engine import MemoryEngine
from omnirt.controller.observability.tracing import JobTracing, trace_id_of
from omnirt.errors import InvalidRequest, ModelNotFound
from omnirt.types import EventKind, GenerateResult, JobEvent, Progress
from tests.unit.controller.test_engine import connect, make_engine, now, request, submit

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def traced_engine(**kw: object) -> tuple[MemoryEngine, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    engine = make_engine(**kw)
    engine.tracing = JobTracing(provider.get_tracer("test"))
    return engine, exporter


def samples(engine: MemoryEngine) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = engine.metrics.render().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_one_job_makes_its_spans_metrics_and_trace_id() -> None:
    engine, exporter = traced_engine()
    parent = propagate.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    token = otel_context.attach(parent)
    try:
        record, _ = submit(engine, request(seed=1, num_inference_steps=2))
    finally:
        otel_context.detach(token)
    job_id = record.job.id
    assert trace_id_of(job_id) == CLIENT_TRACE
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    (assignment,) = link.assignments()
    assert assignment.trace_context["traceparent"].split("-")[1] == CLIENT_TRACE
    handle = engine.workers.get("w1")
    progress = JobEvent(job_id=job_id, kind=EventKind.PROGRESS, progress=Progress(1, 2, "denoise"))
    stage = JobEvent(
        job_id=job_id, kind=EventKind.STAGE, stage="denoise", stage_finished=True, stage_duration_ms=40
    )
    now(engine.worker_event(handle, assignment.assignment_id, progress))
    now(engine.worker_event(handle, assignment.assignment_id, stage))
    now(engine.worker_result(handle, assignment.assignment_id, job_id, GenerateResult(job_id), None))
    assert record.result is not None and record.result.report.trace_id == CLIENT_TRACE

    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"omnirt.job", "validate", "queue", "dispatch", "execute"} <= set(spans)
    job = spans["omnirt.job"]
    assert job.parent is not None and format(job.parent.span_id, "016x") == CLIENT_SPAN
    assert all(spans[n].parent.span_id == job.context.span_id for n in ("validate", "queue", "execute"))  # type: ignore[union-attr]
    executing = assignment.trace_context["traceparent"].split("-")[2]
    assert format(spans["execute"].context.span_id, "016x") == executing
    assert job.attributes is not None and job.attributes["omnirt.state"] == "succeeded"

    got = samples(engine)
    labels = {("model", "tiny-sd"), ("task", "text2image"), ("tenant", "")}
    assert got[("omnirt_jobs_total", frozenset(labels | {("state", "succeeded")}))] == 1
    assert got[("omnirt_requests_total", frozenset(labels | {("code", "OK")}))] == 1
    assert (
        got[("omnirt_stage_duration_seconds_sum", frozenset({("model", "tiny-sd"), ("stage", "denoise")}))]
        == 0.04
    )
    assert got[("omnirt_job_time_to_first_progress_seconds_count", frozenset({("model", "tiny-sd")}))] == 1
    assert got[("omnirt_worker_slots", frozenset({("worker", "w1"), ("mode", "legacy_call")}))] == 1


def test_a_batch_carries_each_jobs_trace_and_a_lost_worker_requeues() -> None:
    engine, exporter = traced_engine(max_batch_size=4)
    first, _ = submit(engine, request(seed=1))
    second, _ = submit(engine, request(seed=2))
    link = connect(engine, "w1")
    engine.upkeep.dispatch()
    submit(engine, request(seed=3, priority=7))  # no free slot: it waits
    (batch,) = link.assignments()
    assert len(batch.items) == 2
    for record in (first, second):
        assert batch.trace_context[f"traceparent.{record.job.id}"].split("-")[1] == trace_id_of(record.job.id)
    got = samples(engine)
    assert got[("omnirt_queue_depth", frozenset({("model", "tiny-sd")}))] == 1
    assert got[("omnirt_queue_depth_by_priority", frozenset({("priority", "7")}))] == 1
    assert got[("omnirt_jobs_running", frozenset({("model", "tiny-sd")}))] == 2
    now(engine.worker_lost(engine.workers.get("w1"), "gone"))
    queues = [s for s in exporter.get_finished_spans() if s.name == "queue"]
    executes = [s for s in exporter.get_finished_spans() if s.name == "execute"]
    assert len(queues) == 2 and len(executes) == 2 and not executes[0].status.is_ok
    assert samples(engine)[("omnirt_job_retries_total", frozenset({("model", "tiny-sd")}))] == 2


def test_a_rejected_request_is_counted_with_its_code() -> None:
    engine, _ = traced_engine()
    with pytest.raises(InvalidRequest):
        submit(engine, request(width=60))
    with pytest.raises(ModelNotFound):
        submit(engine, request(model="no-such-model"))
    got = samples(engine)
    assert (
        got[
            (
                "omnirt_requests_total",
                frozenset(
                    {
                        ("model", "tiny-sd"),
                        ("task", "text2image"),
                        ("code", "INVALID_ARGUMENT"),
                        ("tenant", ""),
                    }
                ),
            )
        ]
        == 1
    )
    assert (
        got[
            (
                "omnirt_requests_total",
                # no task asked and no model to take it from: the task label stays empty
                frozenset({("model", "unknown"), ("task", ""), ("code", "NOT_FOUND"), ("tenant", "")}),
            )
        ]
        == 1
    )


def test_an_idle_controller_exports_a_zero_per_catalog_model() -> None:
    engine, _ = traced_engine()
    connect(engine, "w1", slots=3)
    got = samples(engine)
    models = [spec.id for spec in engine.catalog]
    assert "tiny-sd" in models and "null" in models
    for model in models:
        # Present at 0, not missing: `rate()`, alerts and autoscalers need a series to read.
        assert got[("omnirt_queue_depth", frozenset({("model", model)}))] == 0, model
        assert got[("omnirt_jobs_running", frozenset({("model", model)}))] == 0, model
    assert got[("omnirt_queue_depth_by_priority", frozenset({("priority", "0")}))] == 0
    assert not [key for key in got if key[0] == "omnirt_queue_depth" and dict(key[1]).keys() != {"model"}]
    submit(engine, request(seed=1, priority=3))
    submit(engine, request(model="null", seed=2))
    submit(engine, request(model="null", seed=3))
    depth = {
        dict(labels)["model"]: v
        for (name, labels), v in samples(engine).items()
        if name == "omnirt_queue_depth"
    }
    assert depth["tiny-sd"] == 1 and depth["null"] == 2 and sum(depth.values()) == 3  # the total is a sum()


def test_every_metric_the_docs_name_is_exported() -> None:
    from pathlib import Path

    from prometheus_client import generate_latest

    from omnirt.worker.telemetry import WorkerTelemetry

    worker = WorkerTelemetry("w1", 2, busy=lambda: 0, loaded=list)
    exported = set()
    for text in (make_engine().metrics.render().decode(), generate_latest(worker.registry).decode()):
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M):
            exported.add(name)
            if kind == "histogram":  # the series a query names (the Helm chart's dashboard does)
                exported |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    root = Path(__file__).resolve().parents[3]
    docs = [root / "README.md", *(root / "docs").glob("*.md"), *(root / "deploy").rglob("*.yaml")]
    named = {n for path in docs for n in re.findall(r"\bomnirt_[a-z0-9_]*[a-z0-9]\b", path.read_text())}
    named -= {"omnirt_builtin"}  # the marker file of a built tiny model, not a metric
    assert len(named) > 20
    assert sorted(n for n in named if n not in exported and f"{n}_total" not in exported) == []
