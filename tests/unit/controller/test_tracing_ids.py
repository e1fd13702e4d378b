"""Trace ids without an exporter: `IdOnlyTracer` gives the ids the SDK would, and records nothing."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from omnirt.controller.observability.tracing import IdOnlyTracer, JobTracing, trace_id_of
from tests.unit.controller.test_engine import connect, make_engine, request, submit

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _ids(span: trace.Span) -> tuple[str, str, str]:
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), format(ctx.trace_flags, "02x")


def test_roots_get_new_sampled_traces_and_children_keep_their_parents() -> None:
    tracer = IdOnlyTracer()
    first, second = tracer.start_span("a"), tracer.start_span("b")
    assert first.get_span_context().is_valid and not first.is_recording()
    assert _ids(first)[0] != _ids(second)[0] and _ids(first)[2] == "01"
    for flags in ("01", "00"):  # the caller's sampling decision is kept, as the SDK's default sampler does
        parent = propagate.extract({"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-{flags}"})
        child = tracer.start_span("c", context=parent)
        assert _ids(child)[0] == CLIENT_TRACE and _ids(child)[2] == flags
        assert _ids(child)[1] != "00f067aa0ba902b7"
    with tracer.start_as_current_span("d") as current:
        assert trace.get_current_span() is current


def test_jobs_keep_trace_ids_and_send_the_execute_context_to_workers() -> None:
    engine = make_engine()
    engine.tracing = JobTracing(IdOnlyTracer())
    token = otel_context.attach(propagate.extract({"traceparent": f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"}))
    try:
        traced, _ = submit(engine, request(seed=1, num_inference_steps=2))
    finally:
        otel_context.detach(token)
    fresh, _ = submit(engine, request(seed=2, num_inference_steps=3))
    assert trace_id_of(traced.job.id) == CLIENT_TRACE
    assert len(trace_id_of(fresh.job.id)) == 32 and trace_id_of(fresh.job.id) != CLIENT_TRACE
    link = connect(engine, "w1", slots=2)
    engine.upkeep.dispatch()
    contexts = {a.items[0].job_id: a.trace_context["traceparent"] for a in link.assignments()}
    for record in (traced, fresh):
        _, trace_id, _, flags = contexts[record.job.id].split("-")
        assert (trace_id, flags) == (trace_id_of(record.job.id), "01")


def test_a_controller_without_an_exporter_installs_the_id_only_provider() -> None:
    code = (
        "from opentelemetry import trace; from omnirt.controller.observability import tracing;"
        "print(tracing.setup('omnirt-controller'), type(trace.get_tracer_provider()).__name__)"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "IdOnlyTracerProvider"]
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # exporting: the SDK's spans
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["True", "TracerProvider"]


def test_a_job_accepted_by_another_controller_continues_its_trace_here() -> None:
    """Shared store: A stores its job span's traceparent; B adopts it, and B's dispatch/execute
    spans and the worker's context are children of A's `omnirt.job` span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    a = make_engine()
    a.tracing = JobTracing(provider.get_tracer("a"))
    record, _ = submit(a, request(seed=1, num_inference_steps=2))
    job_id = record.job.id
    stored = a.tracing.traceparent(job_id)
    assert stored.startswith("00-") and a.tracing.traceparent("job-unknown") == ""

    b = JobTracing(provider.get_tracer("b"))
    b.adopt(job_id, stored)
    b.adopt(job_id, "00-" + "0" * 32 + "-" + "0" * 16 + "-01")  # once adopted, kept
    b.dispatched([record], "w-b", "as-1")
    worker_context = b.assignment_context([record])["traceparent"]
    b.finished(record)
    a.tracing.finished(record)

    spans = {s.name: s for s in exported.get_finished_spans()}
    job_span = spans["omnirt.job"]
    assert stored.split("-")[2] == format(job_span.context.span_id, "016x")
    for name in ("dispatch", "execute"):
        assert spans[name].parent is not None and spans[name].parent.span_id == job_span.context.span_id
        assert spans[name].context.trace_id == job_span.context.trace_id
    _, trace_id, span_id, _ = worker_context.split("-")
    assert (trace_id, span_id) == (
        format(job_span.context.trace_id, "032x"),
        format(spans["execute"].context.span_id, "016x"),
    )
    assert trace_id_of(job_id) == trace_id
    b.adopt("job-other", "")  # nothing stored (an older controller accepted it): nothing adopted
    assert b.traceparent("job-other") == ""
