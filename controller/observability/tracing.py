"""OpenTelemetry traces of jobs, and the trace id on every log line about a job.

Each job gets a span `omnirt.job` (a child of the caller's span when the gRPC metadata or the
HTTP headers carry a W3C `traceparent`) with children `validate`, `queue` (one per attempt),
`dispatch` (assignment sent -> the worker's first event) and `execute` (assignment sent -> the
worker's result). With a shared store (Redis) the `omnirt.job` span's context is stored with the
job, and a controller that dispatches a job another one accepted hangs its `dispatch` and
`execute` under it (`JobTracing.adopt`). The `execute` span's context travels to the worker in
`Assignment.trace_context` (`traceparent`; for a batch also `traceparent.JOB_ID` per job), where
the worker's own spans hang under it. The SDK exports over OTLP/HTTP when the standard
`OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set; without
them the spans only carry ids (`IdOnlyTracerProvider`): reports, logs and the context sent to
workers have the same trace ids, and no span is recorded only to be dropped.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, Status, StatusCode, TraceFlags

from omnirt.types import JobState

if TYPE_CHECKING:
    # The type `Tracer.start_as_current_span` returns (OpenTelemetry names it privately).
    from opentelemetry.util._decorator import _AgnosticContextManager

    from omnirt.controller.core.jobs import JobRecord

log = logging.getLogger("omnirt.controller")
TRACER_NAME = "omnirt.controller"
# Trace ids of recent jobs, for log lines that name only the job (bounded: old jobs fall out).
_TRACE_IDS: OrderedDict[str, str] = OrderedDict()
_TRACE_IDS_MAX = 100_000
_provider: Any = None


def exporting_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """True when the standard OTLP variables ask for span export."""
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class IdOnlyTracer(trace.Tracer):
    """Spans that carry W3C ids and record nothing: for a process that exports no span.

    An SDK span costs tens of microseconds to make, end and drop. These cost one random number:
    a child keeps its parent's trace id, flags and state (as the SDK's default parent-based
    sampler does), a root gets a new trace id and the sampled flag, so trace ids in reports and
    logs and the `traceparent` sent to workers are what the SDK would give.
    """

    def start_span(
        self, name: str, context: otel_context.Context | None = None, *args: Any, **kwargs: Any
    ) -> Span:
        parent = trace.get_current_span(context).get_span_context()
        span_id = random.getrandbits(64) or 1
        if parent.is_valid:
            ids = SpanContext(parent.trace_id, span_id, False, parent.trace_flags, parent.trace_state)
        else:
            ids = SpanContext(random.getrandbits(128) or 1, span_id, False, _SAMPLED)
        return NonRecordingSpan(ids)

    def start_as_current_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        *args: Any,
        end_on_exit: bool = True,
        **kwargs: Any,
    ) -> _AgnosticContextManager[Span]:
        return trace.use_span(self.start_span(name, context), end_on_exit=end_on_exit)


class IdOnlyTracerProvider(trace.TracerProvider):
    """The provider of `IdOnlyTracer`s, installed when no exporter is configured."""

    def get_tracer(self, *args: Any, **kwargs: Any) -> trace.Tracer:
        return _ID_ONLY_TRACER


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_ID_ONLY_TRACER = IdOnlyTracer()


def setup(service_name: str) -> bool:
    """Install the tracer provider (once per process); export over OTLP/HTTP when configured.

    Returns True when spans are exported. Without an exporter (and without an
    `OTEL_TRACES_SAMPLER` asking for the SDK's sampling) spans only carry ids
    (`IdOnlyTracerProvider`). `OTEL_SDK_DISABLED=true` leaves tracing off entirely.
    """
    global _provider
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporting = exporting_configured()
    if _provider is None and not exporting and not os.environ.get("OTEL_TRACES_SAMPLER"):
        _provider = IdOnlyTracerProvider()
        trace.set_tracer_provider(_provider)
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    if _provider is None:
        attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
        _provider = TracerProvider(resource=Resource.create(attributes))
        if exporting:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(_provider)
    return exporting


def shutdown() -> None:
    """Flush spans still buffered (at daemon exit)."""
    if _provider is not None and hasattr(_provider, "shutdown"):
        _provider.shutdown()


def trace_id_of(job_id: str) -> str:
    """The trace id (32 hex digits) of a recent job, or ''."""
    return _TRACE_IDS.get(job_id, "")


def _remember(job_id: str, trace_id: str) -> None:
    _TRACE_IDS[job_id] = trace_id
    while len(_TRACE_IDS) > _TRACE_IDS_MAX:
        _TRACE_IDS.popitem(last=False)


class JobTraceFilter(logging.Filter):
    """Adds `trace_id` to records that name a job (`extra={"job_id": ...}`) but not its trace."""

    def filter(self, record: logging.LogRecord) -> bool:
        job_id = getattr(record, "job_id", "")
        if job_id and not getattr(record, "trace_id", ""):
            record.trace_id = trace_id_of(job_id)
        return True


@contextmanager
def remote_parent(carrier: Mapping[str, str]) -> Iterator[None]:
    """Make the W3C trace context in `carrier` (headers or metadata) the parent of spans inside."""
    token = otel_context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        otel_context.detach(token)


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    items = context.invocation_metadata() or ()
    return {k: v for k, v in items if isinstance(v, str)}


class TraceInterceptor(grpc.aio.ServerInterceptor):
    """Takes the caller's trace context from gRPC metadata for the duration of each unary call.

    The wrapped handler of a method is made once and kept (the server's handlers and the
    interceptors after this one depend on the method name only), and a call whose metadata
    carries none of the propagator's fields skips the extraction.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        handler = self._handlers.get(method)
        if handler is None:
            handler = await continuation(handler_call_details)
            if handler is None:  # an unknown method (grpc answers UNIMPLEMENTED): not remembered,
                return handler  # the set of names is open
            handler = self._handlers[method] = self._wrap(handler)
        return handler

    @staticmethod
    def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.request_streaming or not handler.unary_unary:
            return handler
        inner: Any = handler.unary_unary

        async def traced(request: Any, context: grpc.aio.ServicerContext) -> Any:
            carrier = _metadata(context)
            if not carrier.keys() & propagate.get_global_textmap().fields:
                return await inner(request, context)
            with remote_parent(carrier):
                return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            traced,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


@dataclass
class _Spans:
    job: Span
    queue: Span | None = None
    dispatch: Span | None = None
    execute: Span | None = None
    adopted: bool = False  # `job` is another controller's span (a remote parent)


def _end(span: Span | None, error: str = "") -> None:
    if span is not None and span.is_recording():
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()


class JobTracing:
    """The spans of live jobs; the engine calls the hooks."""

    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer
        self._jobs: dict[str, _Spans] = {}

    @property
    def tracer(self) -> trace.Tracer:
        if self._tracer is None:
            # Once: a tracer taken before the provider is installed follows it when it is.
            self._tracer = trace.get_tracer(TRACER_NAME)
        return self._tracer

    def _records(self, spans: _Spans) -> bool:
        """Whether children of this job's span are recorded (not with ids only)."""
        if spans.adopted:
            return not isinstance(self.tracer, IdOnlyTracer)
        return spans.job.is_recording()

    def _child(
        self, spans: _Spans, name: str, start_ns: int | None = None, attrs: dict[str, Any] | None = None
    ) -> Span:
        ctx = trace.set_span_in_context(spans.job)
        return self.tracer.start_span(name, context=ctx, start_time=start_ns, attributes=attrs)

    def submitted(self, record: JobRecord, started_ns: int, validated_ns: int) -> None:
        job = record.job
        span = self.tracer.start_span(
            "omnirt.job",
            context=otel_context.get_current(),
            start_time=started_ns,
            attributes={
                "omnirt.job_id": job.id,
                "omnirt.model": job.model,
                "omnirt.task": str(job.task.value if job.task else ""),
                "omnirt.priority": job.priority,
                "omnirt.tenant": job.tenant,
            },
        )
        spans = _Spans(job=span)
        if span.is_recording():  # children of a span that records nothing would record nothing
            self._child(spans, "validate", started_ns).end(end_time=validated_ns)
            spans.queue = self._child(spans, "queue", validated_ns)
        self._jobs[job.id] = spans
        ctx = span.get_span_context()
        if ctx.is_valid:
            _remember(job.id, format(ctx.trace_id, "032x"))

    def traceparent(self, job_id: str) -> str:
        """The W3C `traceparent` of the job's span, for another controller to adopt ('' if none)."""
        spans = self._jobs.get(job_id)
        if spans is None:
            return ""
        carrier: dict[str, str] = {}
        propagate.inject(carrier, context=trace.set_span_in_context(spans.job))
        return carrier.get("traceparent", "")

    def adopt(self, job_id: str, traceparent: str) -> None:
        """Continue the trace of a job another controller accepted (shared store): this one's
        `dispatch` and `execute` spans, and the worker's, become children of its `omnirt.job`."""
        if job_id in self._jobs or not traceparent:
            return
        span = trace.get_current_span(propagate.extract({"traceparent": traceparent}))
        ctx = span.get_span_context()
        if not ctx.is_valid:
            return
        self._jobs[job_id] = _Spans(job=span, adopted=True)  # a remote parent: nothing here ends it
        _remember(job_id, format(ctx.trace_id, "032x"))

    def discard(self, job_id: str) -> None:
        """Forget a job's spans without ending them (a submission that did not create the job,
        or a job that went on elsewhere)."""
        self._jobs.pop(job_id, None)

    def dispatched(self, records: list[JobRecord], worker_id: str, assignment_id: str) -> None:
        for record in records:
            spans = self._jobs.get(record.job.id)
            if spans is None:
                continue
            _end(spans.queue)
            attrs = {
                "omnirt.worker_id": worker_id,
                "omnirt.assignment_id": assignment_id,
                "omnirt.attempt": record.job.attempts,
                "omnirt.batch_size": len(records),
                "omnirt.tenant": record.job.tenant,
            }
            spans.queue = None
            if self._records(spans):
                spans.dispatch = self._child(spans, "dispatch", attrs=attrs)
            # Always: its context is the parent of the worker's spans.
            spans.execute = self._child(spans, "execute", attrs=attrs)

    def assignment_context(self, records: list[JobRecord]) -> dict[str, str]:
        """W3C trace context of each job's `execute` span, for the worker."""
        carrier: dict[str, str] = {}
        for i, record in enumerate(records):
            spans = self._jobs.get(record.job.id)
            if spans is None or spans.execute is None:
                continue
            one: dict[str, str] = {}
            propagate.inject(one, context=trace.set_span_in_context(spans.execute))
            if "traceparent" not in one:
                continue
            if i == 0:
                carrier.update(one)
            if len(records) > 1:
                carrier[f"traceparent.{record.job.id}"] = one["traceparent"]
        return carrier

    def worker_event(self, record: JobRecord) -> None:
        spans = self._jobs.get(record.job.id)
        if spans is not None and spans.dispatch is not None:
            _end(spans.dispatch)  # the worker has picked the job up
            spans.dispatch = None

    def requeued(self, record: JobRecord, reason: str) -> None:
        spans = self._jobs.get(record.job.id)
        if spans is None:
            return
        _end(spans.dispatch, reason)
        _end(spans.execute, reason)
        spans.dispatch = spans.execute = None
        if self._records(spans):
            spans.queue = self._child(spans, "queue", time.time_ns(), {"omnirt.requeued": reason})

    def finished(self, record: JobRecord) -> None:
        spans = self._jobs.pop(record.job.id, None)
        if spans is None:
            return
        job = record.job
        error = f"{job.error.code}: {job.error.message}" if job.error else ""
        if job.state is not JobState.SUCCEEDED and not error:
            error = job.state.value
        for span in (spans.queue, spans.dispatch, spans.execute):
            _end(span, error)
        spans.job.set_attribute("omnirt.state", job.state.value)
        spans.job.set_attribute("omnirt.attempts", job.attempts)
        if job.error:
            spans.job.set_attribute("omnirt.error_code", job.error.code)
        _end(spans.job, error)


def session_span(session_id: str, model: str, tenant: str) -> tuple[Span, str, dict[str, str]]:
    """The span of a realtime session (a child of the caller's trace context when the call
    carried one: see `remote_parent`), its trace id (32 hex digits) and its W3C context for the
    worker. The caller ends it (`end_session_span`)."""
    span = trace.get_tracer(TRACER_NAME).start_span(
        "omnirt.session",
        context=otel_context.get_current(),
        attributes={"omnirt.session_id": session_id, "omnirt.model": model, "omnirt.tenant": tenant},
    )
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    ctx = span.get_span_context()
    trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
    return span, trace_id, carrier


def end_session_span(span: Span, outcome: str, worker_id: str, chunks: int) -> None:
    if span.is_recording():
        span.set_attribute("omnirt.session.outcome", outcome)
        span.set_attribute("omnirt.worker_id", worker_id)
        span.set_attribute("omnirt.session.chunks", chunks)
        if outcome in ("refused", "invalid_input"):
            span.set_status(Status(StatusCode.ERROR, outcome))
    span.end()


def metadata_context(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """A call's metadata as a W3C carrier (for `remote_parent`)."""
    return _metadata(context)
