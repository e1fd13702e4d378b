"""Metrics, traces and logs through real daemons: numbers that move with real traffic.

The daemons export spans over OTLP/HTTP (the standard `OTEL_EXPORTER_OTLP_ENDPOINT`) to a
small receiver in this test that decodes `ExportTraceServiceRequest`s; the controller serves
`/metrics` on its HTTP port and the worker on its `--metrics` port; both log JSON lines.
"""

from __future__ import annotations

import gzip
import json
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client.parser import text_string_to_metric_families

from omnirt.v1 import generation_pb2_grpc, types_pb2
from tests.daemons import Controller, RedisServer, Worker, free_port, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class OtlpReceiver:
    """An OTLP/HTTP trace endpoint (`POST /v1/traces`, protobuf) that keeps every span."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                receiver.add(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        for resource_spans in request.resource_spans:
            attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    with self.lock:
                        self.spans.append(
                            {
                                "service": attrs.get("service.name", ""),
                                "name": span.name,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(),
                                "attributes": {a.key: a.value for a in span.attributes},
                                "error": span.status.code == span.status.STATUS_CODE_ERROR,
                            }
                        )

    def trace(self, trace_id: str, names: set[str], timeout: float = 15) -> list[dict[str, Any]]:
        """The spans of a trace once every name in `names` has arrived."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                spans = [s for s in self.spans if s["trace_id"] == trace_id]
            if names <= {s["name"] for s in spans} or time.monotonic() > deadline:
                return spans
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def _otel_env(otlp: OtlpReceiver) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path, otlp: OtlpReceiver) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), "--log-json", http=True)
    daemon.env.update(_otel_env(otlp))
    daemon.start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path, otlp: OtlpReceiver) -> Iterator[Worker]:
    port = free_port()
    daemon = Worker(
        log_dir,
        controller.address,
        "w-obs",
        model_dir,
        "--slots",
        "2",
        "--metrics",
        f"127.0.0.1:{port}",
        "--log-json",
        "--log-level",
        "DEBUG",  # a job's lines on the worker are DEBUG ("running", "succeeded")
    )
    daemon.env.update(_otel_env(otlp))
    daemon.metrics = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    daemon.start()
    controller.wait_worker("w-obs")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=60) as client:
        yield client


def scrape(url: str) -> tuple[str, Samples]:
    text = httpx.get(url, timeout=10).text
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def has(samples: Samples, name: str, **labels: str) -> bool:
    """True when a sample of `name` with exactly `labels` is exported (a 0 counts)."""
    return (name, frozenset(labels.items())) in samples


def promtool_check(text: str) -> None:
    if shutil.which("promtool") is None:
        return  # parsed above by prometheus_client; promtool adds the naming lint where installed
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30
    )
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


def test_controller_metrics_move_with_real_traffic(http: httpx.Client, controller: Controller) -> None:
    url = controller.http + "/metrics"
    _, before = scrape(url)
    for model in ("null", "tiny-sd", "unserved-sd", "broken-sd"):  # idle: a 0 per catalog model
        assert has(before, "omnirt_jobs_running", model=model), model
        assert has(before, "omnirt_queue_depth", model=model), model
    assert value(before, "omnirt_jobs_running") == 0 and value(before, "omnirt_queue_depth") == 0
    assert (
        http.post("/v1/generate", json={"model": "null", "prompt": "x", "num_inference_steps": 3}).status_code
        == 200
    )
    assert http.post("/v1/generate", json={"model": "null", "prompt": "x", "width": 60}).status_code == 400
    assert http.post("/v1/generate", json={"model": "broken-sd", "prompt": "x"}).status_code == 400
    queued = http.post("/v1/jobs", json={"model": "unserved-sd", "prompt": "x", "priority": 5}).json()["job"]
    text, mid = scrape(url)
    http.delete(f"/v1/jobs/{queued['id']}")
    _, after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    null = {"model": "null", "task": "text2image"}
    assert delta("omnirt_jobs_total", **null, state="succeeded") == 1
    assert delta("omnirt_requests_total", **null, code="OK") == 1
    assert delta("omnirt_requests_total", **null, code="INVALID_ARGUMENT") == 1
    assert delta("omnirt_job_failures_total", model="broken-sd", code="FAILED_PRECONDITION") == 1
    assert delta("omnirt_jobs_total", model="unserved-sd", state="cancelled") == 1
    assert delta("omnirt_job_queue_wait_seconds_count", model="null") == 1
    assert delta("omnirt_job_execution_seconds_count", **null) == 1
    assert delta("omnirt_job_latency_seconds_count", **null, state="succeeded") == 1
    assert delta("omnirt_job_time_to_first_progress_seconds_count", model="null") == 1
    assert delta("omnirt_stage_duration_seconds_count", model="null", stage="denoise") == 1
    assert delta("omnirt_stage_duration_seconds_sum", model="null", stage="denoise") > 0
    assert delta("omnirt_batch_size_count", model="null") == 1
    assert delta("omnirt_http_requests_total", route="/v1/generate", status="200") == 1
    assert delta("omnirt_http_requests_total", route="/v1/generate", status="400") == 2
    assert value(mid, "omnirt_queue_depth", model="unserved-sd") == 1
    assert value(mid, "omnirt_queue_depth") == 1, "the total is the sum over models"
    assert has(after, "omnirt_queue_depth", model="unserved-sd")
    assert value(after, "omnirt_queue_depth", model="unserved-sd") == 0
    assert value(mid, "omnirt_queue_depth_by_priority", priority="5") == 1
    assert value(after, "omnirt_queue_depth_by_priority", priority="5") == 0
    assert value(after, "omnirt_workers", state="ready") == 1
    assert value(after, "omnirt_worker_slots", worker="w-obs") == 2
    assert value(after, "process_resident_memory_bytes") > 0
    promtool_check(text)


def test_worker_metrics_show_runs_loads_and_memory(http: httpx.Client, worker: Worker) -> None:
    url = worker.metrics  # type: ignore[attr-defined]
    _, before = scrape(url)
    assert http.post("/v1/generate", json={"model": "null", "prompt": "x"}).status_code == 200
    assert http.post("/v1/generate", json={"model": "tiny-sd", "prompt": "x", "seed": 1}).status_code == 200
    text, after = scrape(url)
    assert (
        value(after, "omnirt_worker_jobs_total", model="null", code="OK")
        - value(before, "omnirt_worker_jobs_total", model="null", code="OK")
        == 1
    )
    assert value(after, "omnirt_worker_model_load_seconds_count", model="tiny-sd") == 1, "one cold start"
    assert value(after, "omnirt_worker_model_load_seconds_sum", model="tiny-sd") > 0
    assert value(after, "omnirt_worker_stage_duration_seconds_count", model="tiny-sd", stage="denoise") >= 1
    assert value(after, "omnirt_worker_memory_bytes") > 0 and value(after, "omnirt_worker_own_slots") == 2
    # The controller exports `omnirt_worker_slots` per worker; the same name here would double a sum().
    assert not [name for name, _ in after if name == "omnirt_worker_slots"]
    assert value(after, "omnirt_worker_peak_memory_bytes", model="tiny-sd") > 0
    assert value(after, "omnirt_worker_loaded_models") == 1
    promtool_check(text)


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


CONTROLLER_SPANS = {"omnirt.job", "validate", "queue", "dispatch", "execute"}
WORKER_SPANS = {"worker.execute", "denoise", "export"}


def test_one_trace_from_the_grpc_client_through_controller_and_worker(
    controller: Controller, worker: Worker, otlp: OtlpReceiver
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    with grpc.insecure_channel(controller.address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        request = types_pb2.GenerateRequest(model="null", prompt="traced", num_inference_steps=2)
        response = stub.Generate(request, metadata=[("traceparent", traceparent)], timeout=60)
    assert response.result.report.trace_id == trace_id
    spans = otlp.trace(trace_id, CONTROLLER_SPANS | WORKER_SPANS)
    by_name = {s["name"]: s for s in spans}
    assert set(by_name) >= CONTROLLER_SPANS | WORKER_SPANS, sorted(by_name)
    assert {by_name[n]["service"] for n in CONTROLLER_SPANS} == {"omnirt-controller"}
    assert {by_name[n]["service"] for n in WORKER_SPANS} == {"omnirt-worker"}
    job = by_name["omnirt.job"]
    assert job["parent"] == client_span, "the job span is a child of the client's span"
    assert all(by_name[n]["parent"] == job["span_id"] for n in ("validate", "queue", "dispatch", "execute"))
    assert by_name["worker.execute"]["parent"] == by_name["execute"]["span_id"]
    assert by_name["denoise"]["parent"] == by_name["worker.execute"]["span_id"]
    assert job["attributes"]["omnirt.job_id"].string_value == response.job.id
    assert job["attributes"]["omnirt.state"].string_value == "succeeded"


def test_http_traceparent_and_failed_jobs_are_traced(http: httpx.Client, otlp: OtlpReceiver) -> None:
    trace_id, _, traceparent = _traceparent()
    r = http.post("/v1/generate", json={"model": "null", "prompt": "x"}, headers={"traceparent": traceparent})
    assert r.json()["result"]["report"]["trace_id"] == trace_id
    assert {"omnirt.job", "worker.execute"} <= {
        s["name"] for s in otlp.trace(trace_id, {"omnirt.job", "worker.execute"})
    }
    trace_id, _, traceparent = _traceparent()
    r = http.post(
        "/v1/generate", json={"model": "broken-sd", "prompt": "x"}, headers={"traceparent": traceparent}
    )
    assert r.status_code == 400
    spans = {s["name"]: s for s in otlp.trace(trace_id, {"omnirt.job", "worker.execute"})}
    assert spans["omnirt.job"]["error"] and spans["worker.execute"]["error"]


def test_every_log_line_about_a_job_has_its_trace_id(
    http: httpx.Client, controller: Controller, worker: Worker
) -> None:
    trace_id, _, traceparent = _traceparent()
    job_id = http.post(
        "/v1/generate", json={"model": "null", "prompt": "x"}, headers={"traceparent": traceparent}
    ).json()["job"]["id"]
    time.sleep(0.3)  # let the worker's last lines reach its log file
    for daemon in (controller, worker):
        lines = [json.loads(line) for line in daemon.log().splitlines() if line.startswith("{")]
        about_jobs = [line for line in lines if line.get("job_id")]
        assert about_jobs and all(line.get("trace_id") for line in about_jobs), daemon.name
        ours = [line for line in about_jobs if job_id in line["job_id"]]
        assert ours and {line["trace_id"] for line in ours} == {trace_id}, daemon.name


def test_redis_controllers_each_report_the_clusters_queue_per_model(
    log_dir: Path, user_catalog: Path
) -> None:
    redis_server = RedisServer(log_dir).start()
    ports = [free_port(), free_port()]
    controllers = [
        Controller(
            log_dir, "--catalog", str(user_catalog), "--store", redis_server.url, "--http", f"127.0.0.1:{p}"
        )
        for p in ports
    ]
    try:
        for daemon in controllers:
            daemon.start()
        first, second = (f"http://127.0.0.1:{p}" for p in ports)
        for model in ("null", "unserved-sd"):
            assert has(scrape(second + "/metrics")[1], "omnirt_jobs_running", model=model), model
        job = httpx.post(first + "/v1/jobs", json={"model": "unserved-sd", "prompt": "x"}, timeout=10).json()
        # The other controller holds no record of the job, yet reports the queue Redis holds
        # (read on its upkeep tick, once a second).
        wait_for(
            lambda: value(scrape(second + "/metrics")[1], "omnirt_queue_depth", model="unserved-sd") == 1,
            30,
            "the second controller to see the job queued",
        )
        _, got = scrape(second + "/metrics")
        assert value(got, "omnirt_queue_depth", model="null") == 0 and has(
            got, "omnirt_queue_depth", model="null"
        )
        httpx.delete(f"{first}/v1/jobs/{job['job']['id']}", timeout=10)
        wait_for(
            lambda: value(scrape(second + "/metrics")[1], "omnirt_queue_depth", model="unserved-sd") == 0,
            30,
            "the second controller to see the queue empty",
        )
    finally:
        for daemon in controllers:
            daemon.stop()
        redis_server.stop()
