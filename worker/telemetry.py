"""What the worker says about its work: log lines, its Prometheus metrics (on its own `--metrics`
port, beside the `/readyz` and `/livez` probes) and its OpenTelemetry spans.

Every log line carries the worker id and, inside a job, its ids (`job_context`, `setup_logging`):
job and assignment ids live in context variables, so they follow a job from its asyncio task into
the pipeline thread (`asyncio.to_thread` copies the context) without being passed around.

The metrics and spans are made from what each assignment returns, after it ran, so no executor
needs to know about them: one `worker.execute` span per job, a child of the controller's `execute` span (the
W3C context in `Assignment.trace_context`), with one child span per stage timing of the
RunReport (`load`, `encode`, `denoise`, `decode`, `export`). Spans are exported over OTLP/HTTP
when the standard `OTEL_EXPORTER_OTLP_*` endpoint variables are set; a daemon without an
exporter makes no span at all (nothing would ever read them).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry import propagate, trace
from opentelemetry.trace import Status, StatusCode
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer

from omnirt._internal.buckets import BATCH_BUCKETS, LATENCY_BUCKETS
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.types import RunReport
from omnirt.worker.runtime.backends import current_rss_bytes

log = logging.getLogger(__name__)
TRACER_NAME = "omnirt.worker"
_provider: Any = None
# False once `setup_tracing` found no exporter: spans would only be made to be dropped.
_make_spans = True
# /livez: the event loop must run a callback within this many seconds. The listener answers from
# threads of its own, so without this a worker whose loop is stuck (no heartbeat sent, no job
# taken) would still look alive. Busy pipeline threads hand the GIL over every 5 ms
# (sys.getswitchinterval()), so a healthy loop answers in milliseconds even then.
LOOP_ANSWER_S = 2.0

disable_created_metrics()


def setup_tracing(service_name: str) -> bool:
    """Install the SDK tracer provider; returns True when spans are exported (OTLP/HTTP)."""
    global _provider, _make_spans
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        _make_spans = False  # tracing off
        return False
    if _provider is not None:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    _provider = TracerProvider(resource=Resource.create(attributes))
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() != "none"
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    if exporter and endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(_provider)
    _make_spans = bool(exporter and endpoint)
    return _make_spans


def shutdown_tracing() -> None:
    """Flush buffered spans (at exit)."""
    if _provider is not None:
        _provider.shutdown()


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `PORT` (all interfaces) -> (host, port)."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"metrics address must be HOST:PORT or PORT, not {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)  # [::]:9100: IPv6


class WorkerTelemetry:
    """Metrics and spans of one worker; `assignment_done` records each finished assignment.

    `ready` says why the worker is not ready for work ("" while it is): `/readyz` answers 503
    with that reason. It is called from the listener's threads.
    """

    def __init__(
        self,
        worker_id: str,
        slots: int,
        busy: Callable[[], int],
        loaded: Callable[[], list[str]],
        ready: Callable[[], str] = lambda: "",
    ) -> None:
        self.worker_id = worker_id
        self._ready = ready
        self.registry = r = CollectorRegistry()
        self.jobs = Counter(
            "omnirt_worker_jobs",
            "Jobs this worker ran, by outcome code (OK or the error)",
            ["model", "code"],
            registry=r,
        )
        self.execution = Histogram(
            "omnirt_worker_execution_seconds",
            "Assignment wall time on the worker",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "omnirt_worker_stage_duration_seconds",
            "Stage durations of runs (load, denoise, decode, ...)",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.load = Histogram(
            "omnirt_worker_model_load_seconds",
            "Model load time (cold starts only)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.peak = Gauge(
            "omnirt_worker_peak_memory_bytes",
            "Peak memory of the latest run of a model",
            ["model"],
            registry=r,
        )
        self.batch = Histogram(
            "omnirt_worker_batch_size", "Jobs per assignment", ["model"], buckets=BATCH_BUCKETS, registry=r
        )
        self.preemptions = Counter(
            "omnirt_worker_step_preemptions",
            "Times a job's step batch was paused at a step boundary for a more urgent one",
            ["model"],
            registry=r,
        )
        self.step_rows = Histogram(
            "omnirt_worker_step_rows",
            "Mean rows per denoiser forward of each job the step engine ran",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        # Not `omnirt_worker_slots`: the controller exports that name per worker, and one name on
        # both daemons would count every slot twice in a sum() over all scraped targets.
        Gauge("omnirt_worker_own_slots", "Assignments this worker runs at once", registry=r).set(slots)
        Gauge("omnirt_worker_busy_jobs", "Jobs running now", registry=r).set_function(lambda: float(busy()))
        Gauge("omnirt_worker_memory_bytes", "Resident memory of the worker process", registry=r).set_function(
            lambda: float(current_rss_bytes())
        )
        Gauge("omnirt_worker_loaded_models", "Models held in the model cache", registry=r).set_function(
            lambda: float(len(loaded()))
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        # `metric.labels(...)` by label values: prometheus_client checks them and takes a lock on
        # every lookup, several times per job; the values (models, codes, stages) are few.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def _series(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def serve(self, address: str) -> None:
        """Serve `/metrics`, `/readyz` and `/livez` on `address` from background threads.

        Called on the daemon's event loop (if any): `/livez` checks that loop answers.
        OSError when the address cannot be bound.
        """
        host, port = parse_address(address)
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        app = http_app(make_wsgi_app(self.registry), self._ready, lambda: loop_stall(loop))

        class Server(ThreadingWSGIServer):
            address_family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        server = make_server(host, port, app, Server, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, name="omnirt-worker-http", daemon=True).start()
        log.info("metrics on http://%s:%d/metrics (probes: /readyz, /livez)", host, port)

    def assignment_done(
        self, assignment: Assignment, outcomes: list[ItemOutcome], start_ns: int, end_ns: int
    ) -> None:
        """Record metrics and spans of a finished assignment (never raises)."""
        try:
            self._record(assignment, outcomes, start_ns, end_ns)
        except Exception:  # telemetry must never cost a job
            log.exception("cannot record telemetry of assignment %s", assignment.assignment_id)

    def _record(
        self, assignment: Assignment, outcomes: list[ItemOutcome], start_ns: int, end_ns: int
    ) -> None:
        model = assignment.model.id
        self._series(self.execution, model).observe((end_ns - start_ns) / 1e9)
        self._series(self.batch, model).observe(len(assignment.items))
        by_job = {o.job_id: o for o in outcomes}
        tracer = trace.get_tracer(TRACER_NAME) if _make_spans else None
        for item in assignment.items:
            outcome = by_job.get(item.job_id)
            error = outcome.error if outcome else None
            report = outcome.result.report if outcome and outcome.result else None
            self._series(self.jobs, model, error.code if error else "OK").inc()
            if tracer is None:
                self._stage_metrics(model, report)
                continue
            carrier = {"traceparent": assignment.trace_context.get(f"traceparent.{item.job_id}", "")}
            carrier["traceparent"] = carrier["traceparent"] or assignment.trace_context.get("traceparent", "")
            parent = propagate.extract(carrier) if carrier["traceparent"] else None
            span = tracer.start_span(
                "worker.execute",
                context=parent,
                start_time=start_ns,
                attributes={
                    "omnirt.worker_id": self.worker_id,
                    "omnirt.job_id": item.job_id,
                    "omnirt.assignment_id": assignment.assignment_id,
                    "omnirt.model": model,
                    "omnirt.attempt": item.attempt,
                    "omnirt.batch_size": len(assignment.items),
                },
            )
            if report is not None:
                base_ns = int(report.started_at.timestamp() * 1e9) if report.started_at else start_ns
                ctx = trace.set_span_in_context(span)
                for timing in report.timings:
                    begin = base_ns + int(timing.start_offset_ms * 1e6)
                    stage = tracer.start_span(timing.name, context=ctx, start_time=begin)
                    stage.end(end_time=begin + int(timing.duration_ms * 1e6))
            self._stage_metrics(model, report)
            if error is not None:
                span.set_status(Status(StatusCode.ERROR, f"{error.code}: {error.message}"))
            span.end(end_time=end_ns)

    def _stage_metrics(self, model: str, report: RunReport | None) -> None:
        if report is None:
            return
        for timing in report.timings:
            self._series(self.stage, model, timing.name).observe(timing.duration_ms / 1000)
            if timing.name == "load":
                self._series(self.load, model).observe(timing.duration_ms / 1000)
        if report.peak_memory_bytes:
            self._series(self.peak, model).set(report.peak_memory_bytes)
        shared = report.config_resolved.get("step_engine")
        if isinstance(shared, dict) and shared.get("used"):
            self._series(self.step_rows, model).observe(float(shared.get("mean_rows") or 0))
            if shared.get("preemptions"):
                self._series(self.preemptions, model).inc(float(shared["preemptions"]))


# ---- the HTTP listener: /metrics and the probes -------------------------------------------------

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def loop_stall(loop: asyncio.AbstractEventLoop | None, timeout: float = LOOP_ANSWER_S) -> str:
    """Why `loop` is not alive: it did not run a callback within `timeout` seconds ("" when it did,
    or when there is no loop)."""
    if loop is None:
        return ""
    answered = threading.Event()
    try:
        loop.call_soon_threadsafe(answered.set)
    except RuntimeError:
        return "the event loop is closed"
    if answered.wait(timeout):
        return ""
    return f"the event loop did not answer within {timeout:g} s"


def http_app(metrics: WsgiApp, ready: Callable[[], str], live: Callable[[], str]) -> WsgiApp:
    """`/metrics` (prometheus_client's app), `/readyz` and `/livez`: 200 `{"status": "SERVING"}`,
    or 503 `{"status": "NOT_SERVING", "reason": ...}` (the controller's `/healthz` shape); any
    other path is a JSON 404, so a mistyped probe path fails instead of passing."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        check = {"/readyz": ready, "/livez": live}.get(path)
        if check is None:
            message = f"no route {path}: this listener serves /metrics, /readyz and /livez"
            body: dict[str, Any] = {"error": {"code": "NOT_FOUND", "message": message}}
            status = "404 Not Found"
        elif reason := check():
            body, status = {"status": "NOT_SERVING", "reason": reason}, "503 Service Unavailable"
        else:
            body, status = {"status": "SERVING"}, "200 OK"
        data = json.dumps(body).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        start_response(status, [*headers, ("Cache-Control", "no-store")])
        return [data]

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log line per request: a probe every few seconds would fill the log."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


# ---- log lines: every one carries the worker id and, inside a job, its ids -----------------------

job_id_var: ContextVar[str] = ContextVar("omnirt_job_id", default="")
assignment_id_var: ContextVar[str] = ContextVar("omnirt_assignment_id", default="")
trace_id_var: ContextVar[str] = ContextVar("omnirt_trace_id", default="")


@contextmanager
def job_context(job_ids: list[str], assignment_id: str, trace_id: str = "") -> Iterator[None]:
    """Tag log lines inside the block with the jobs (comma-joined for a batch) and assignment."""
    tokens = (
        job_id_var.set(",".join(job_ids)),
        assignment_id_var.set(assignment_id),
        trace_id_var.set(trace_id),
    )
    try:
        yield
    finally:
        trace_id_var.reset(tokens[2])
        assignment_id_var.reset(tokens[1])
        job_id_var.reset(tokens[0])


class ContextFilter(logging.Filter):
    """Adds `worker_id`, `job_id`, `assignment_id` and `trace_id` to every record."""

    def __init__(self, worker_id: str) -> None:
        super().__init__()
        self.worker_id = worker_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker_id = self.worker_id
        record.job_id = job_id_var.get()
        record.assignment_id = assignment_id_var.get()
        record.trace_id = trace_id_var.get()
        return True


class TextFormatter(logging.Formatter):
    """`time level logger [job=...] message`; the job tag only inside a job."""

    def format(self, record: logging.LogRecord) -> str:
        job = getattr(record, "job_id", "")
        record.job_tag = f" [job={job}]" if job else ""
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker_id": getattr(record, "worker_id", ""),
        }
        for key in ("job_id", "assignment_id", "trace_id"):
            value = getattr(record, key, "")
            if value:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str, json_lines: bool, worker_id: str) -> None:
    """Send every logger's records to stderr with the worker's context."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ContextFilter(worker_id))
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s%(job_tag)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter (download/progress notices) stays at warnings unless debugging.
    for noisy in ("diffusers", "transformers", "urllib3", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)
