"""Prometheus metrics of the controller, fed by the engine's own events (prometheus_client).

Counters and histograms move when the engine accepts, dispatches, hears from and finishes a
job; gauges (queue depth, running jobs, workers, slots) are read from the engine's state at
scrape time, so they can never drift from what `ListJobs` and `ListWorkers` show (the Redis
engine's queue and running counts are the cluster's, refreshed on its once-a-second upkeep tick). Each engine
has its own registry (several engines in one process, as in unit tests, never collide).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from omnirt._internal.buckets import BATCH_BUCKETS, LATENCY_BUCKETS
from omnirt.errors import OmniRTError
from omnirt.types import EventKind, GenerateRequest, JobEvent, JobState, WorkerInfo, WorkerState

if TYPE_CHECKING:
    from omnirt.controller.core.catalog import Catalog
    from omnirt.controller.core.jobs import JobRecord


@dataclass(frozen=True)
class Gauges:
    """What the gauges show, read from an engine at scrape time."""

    queued_by_model: dict[str, int] = field(default_factory=dict)
    queued_by_priority: dict[int, int] = field(default_factory=dict)
    running_by_model: dict[str, int] = field(default_factory=dict)
    workers: list[WorkerInfo] = field(default_factory=list)  # this controller's own
    # Jobs queued or running, by tenant ("" when auth is off).
    active_by_tenant: dict[str, int] = field(default_factory=dict)
    # Queued jobs by queue: a model's, and `model@backend` for the jobs pinned to a backend (the
    # Redis engine's rule for unserved jobs reads it; the gauges show them by model).
    queued_by_queue: dict[str, int] = field(default_factory=dict)


class Observed(Protocol):
    """What the metrics read from an engine (the in-memory one or the Redis one)."""

    catalog: Catalog

    def gauge_snapshot(self) -> Gauges:
        """Queued jobs by model and by priority, running jobs by model, and the workers."""
        ...


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# `_created` series double every counter for little use; Prometheus does not need them.
disable_created_metrics()


def _task(value: object) -> str:
    return str(getattr(value, "value", value) or "")


class _Series:
    """`metric.labels(*values)` remembered per label values: the engine's hooks run several times
    per job, and prometheus_client checks the values and takes a lock on every lookup.

    The label values are few (models, tasks, states, error codes, stages), as in the metric itself.
    """

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def __call__(self, metric: Any, *values: str) -> Any:
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child


class _StateCollector(Collector):
    """Gauges read from the engine when Prometheus scrapes."""

    def __init__(self, engine: Observed) -> None:
        self.engine = engine
        self._priorities: set[int] = {0}  # priorities once seen report 0, not vanish
        self._tenants: set[str] = set()  # likewise tenants (from the key file: a bounded set)

    def collect(self) -> Iterator[Metric]:
        gauges = self.engine.gauge_snapshot()
        # Every catalog model has a series from the start, at 0 when idle: an autoscaler or an
        # alert reads "no series" as "no data", not as an empty queue.
        models = sorted({s.id for s in self.engine.catalog} | gauges.queued_by_model.keys())
        depth = GaugeMetricFamily("omnirt_queue_depth", "Jobs waiting for a worker", labels=["model"])
        for model in models:
            depth.add_metric([model], gauges.queued_by_model.get(model, 0))
        yield depth
        self._priorities.update(gauges.queued_by_priority)
        by_priority = GaugeMetricFamily(
            "omnirt_queue_depth_by_priority", "Jobs waiting for a worker, by priority", labels=["priority"]
        )
        for priority in sorted(self._priorities):
            by_priority.add_metric([str(priority)], gauges.queued_by_priority.get(priority, 0))
        yield by_priority
        running = GaugeMetricFamily("omnirt_jobs_running", "Jobs running on a worker now", labels=["model"])
        for model in sorted(set(models) | gauges.running_by_model.keys()):
            running.add_metric([model], gauges.running_by_model.get(model, 0))
        yield running
        self._tenants.update(gauges.active_by_tenant)
        active = GaugeMetricFamily(
            "omnirt_tenant_active_jobs", "Jobs queued or running, by tenant", labels=["tenant"]
        )
        for tenant in sorted(self._tenants):
            active.add_metric([tenant], gauges.active_by_tenant.get(tenant, 0))
        yield active
        workers = gauges.workers
        by_state = Tally(w.state for w in workers)
        gauge = GaugeMetricFamily("omnirt_workers", "Connected workers by state", labels=["state"])
        for state in WorkerState:
            gauge.add_metric([state.value], by_state.get(state, 0))
        yield gauge
        slots = GaugeMetricFamily(
            "omnirt_worker_slots", "Pipeline calls a worker runs at once", labels=["worker", "mode"]
        )
        busy = GaugeMetricFamily(
            "omnirt_worker_busy_slots", "Slots of a worker in use now", labels=["worker", "mode"]
        )
        for w in workers:
            slots.add_metric([w.id, w.execution_mode], w.slots)
            busy.add_metric([w.id, w.execution_mode], w.busy_slots)
        yield slots
        yield busy


class EngineMetrics:
    """The controller's metrics; the engine calls the hooks, `/metrics` calls `render`."""

    def __init__(self, engine: Observed, registry: CollectorRegistry | None = None) -> None:
        self.engine = engine
        self.registry = r = registry or CollectorRegistry()
        self.requests = Counter(
            "omnirt_requests",
            "Generation requests (Generate, Submit) by outcome code (OK or the error)",
            ["model", "task", "code", "tenant"],
            registry=r,
        )
        self.jobs = Counter(
            "omnirt_jobs", "Jobs that reached a final state", ["model", "task", "state", "tenant"], registry=r
        )
        self.quota_refusals = Counter(
            "omnirt_quota_refusals",
            "Submissions refused by a tenant's quota (reason: max_queued or rate)",
            ["tenant", "reason"],
            registry=r,
        )
        self.failures = Counter(
            "omnirt_job_failures", "Failed jobs by error code", ["model", "task", "code"], registry=r
        )
        self.retries = Counter(
            "omnirt_job_retries",
            "Jobs put back in the queue after their worker gave up",
            ["model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "omnirt_job_queue_wait_seconds",
            "Time a job waited in the queue before dispatch (each attempt)",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.execution = Histogram(
            "omnirt_job_execution_seconds",
            "Time from dispatch to the worker's result",
            ["model", "task"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "omnirt_job_latency_seconds",
            "End to end: from submission to the final state",
            ["model", "task", "state"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.first_progress = Histogram(
            "omnirt_job_time_to_first_progress_seconds",
            "Time from submission to the job's first progress event",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "omnirt_stage_duration_seconds",
            "Duration of a stage on the worker (load, encode, denoise, decode, export), per job",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch = Histogram(
            "omnirt_batch_size", "Jobs per pipeline call", ["model"], buckets=BATCH_BUCKETS, registry=r
        )
        self.http_requests = Counter(
            "omnirt_http_requests",
            "HTTP gateway requests by route and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "omnirt_http_request_duration_seconds",
            "HTTP gateway request duration (streams: until they end)",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.realtime = SessionMetrics(r)  # the SessionManager's hooks
        self.webhooks = Counter(
            "omnirt_webhook_deliveries",
            "Webhook delivery attempts by outcome (delivered, retry, gave_up, refused)",
            ["outcome"],
            registry=r,
        )
        r.register(_StateCollector(engine))
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self._dispatched: dict[str, float] = {}
        self._progressed: set[str] = set()
        self._series = _Series()

    def render(self) -> bytes:
        """The exposition text (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry)

    # ---- hooks the engine calls -----------------------------------------------------------

    def _labels(self, request: GenerateRequest) -> tuple[str, str]:
        """Model and task labels of a request that may not validate (the model's task by default)."""
        try:
            spec = self.engine.catalog.resolve(request.model)
        except Exception:
            return "unknown", _task(request.task)  # a label per misspelt name would grow without bound
        return spec.id, _task(request.task or (spec.tasks[0] if spec.tasks else ""))

    def request_accepted(self, record: JobRecord) -> None:
        job = record.job
        self._series(self.requests, job.model, _task(job.task), "OK", job.tenant).inc()

    def request_rejected(self, request: GenerateRequest, error: OmniRTError, tenant: str = "") -> None:
        self._series(self.requests, *self._labels(request), error.code.name, tenant).inc()

    def quota_refused(self, tenant: str, reason: str) -> None:
        """A submission of `tenant` refused by its quota (`tenants.REASON_*`)."""
        self._series(self.quota_refusals, tenant, reason).inc()

    def dispatched(self, records: list[JobRecord]) -> None:
        now = time.monotonic()
        model = records[0].job.model
        self._series(self.batch, model).observe(len(records))
        for record in records:
            self._series(self.queue_wait, model).observe(max(0.0, now - record.enqueued_at))
            self._dispatched[record.job.id] = now

    def worker_event(self, record: JobRecord, event: JobEvent) -> None:
        job = record.job
        if event.kind is EventKind.STAGE and event.stage_finished:
            self._series(self.stage, job.model, event.stage).observe(event.stage_duration_ms / 1000)
        elif event.kind is EventKind.PROGRESS and job.id not in self._progressed:
            self._progressed.add(job.id)
            self._series(self.first_progress, job.model).observe(time.monotonic() - record.first_enqueued_at)

    def result_received(self, record: JobRecord) -> None:
        started = self._dispatched.pop(record.job.id, None)
        if started is not None:
            self._series(self.execution, record.job.model, _task(record.job.task)).observe(
                time.monotonic() - started
            )

    def requeued(self, record: JobRecord) -> None:
        self._dispatched.pop(record.job.id, None)
        self._series(self.retries, record.job.model).inc()

    def finished(self, record: JobRecord) -> None:
        job = record.job
        model, task, state = job.model, _task(job.task), job.state.value
        self._series(self.jobs, model, task, state, job.tenant).inc()
        if job.state is JobState.FAILED:
            self._series(self.failures, model, task, job.error.code if job.error else "UNKNOWN").inc()
        self._series(self.latency, model, task, state).observe(time.monotonic() - record.first_enqueued_at)
        self._dispatched.pop(job.id, None)
        self._progressed.discard(job.id)


class SessionMetrics:
    """Realtime sessions: open now, ended by reason, chunks relayed (controller/realtime)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Counter(
            "omnirt_sessions",
            "Realtime sessions by outcome (opened, then one end reason each: ended, refused, "
            "client_gone, idle_timeout, max_duration, invalid_input)",
            ["model", "outcome"],
            registry=registry,
        )
        self.active = Gauge(
            "omnirt_sessions_active", "Realtime sessions open now", ["model"], registry=registry
        )
        self.chunks = Counter(
            "omnirt_session_chunks", "Output chunks relayed to session clients", ["model"], registry=registry
        )

    def session(self, outcome: str, model: str, active: int) -> None:
        self.sessions.labels(model, outcome).inc()
        self.active.labels(model).set(active)

    def chunk(self, model: str) -> None:
        self.chunks.labels(model).inc()
