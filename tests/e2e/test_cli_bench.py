"""`omnirtctl bench` as a user runs it: a real process against a real controller and a worker
serving the `null` model (slow jobs come from its `sleep_ms_per_step` extra)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from omnirt import Client
from tests.daemons import Controller, Worker, free_port

MAX_QUEUE = 2


@pytest.fixture(scope="module")
def controller(log_dir: Path) -> Iterator[Controller]:
    """A controller with a tiny queue, so a burst of requests meets RESOURCE_EXHAUSTED."""
    daemon = Controller(log_dir, "--max-queue", str(MAX_QUEUE)).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir, controller.address, "w-null", model_dir, "--models", "null", "--slots", "1"
    ).start()
    controller.wait_worker("w-null")
    yield daemon
    daemon.stop()


def omnirtctl(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "omnirt.cli.main"]
    env = {**os.environ, "OMNIRT_CONTROLLER": address}
    # The timeout only guards the suite against a bench that would not stop by itself.
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120, env=env)


def bench_json(controller: Controller, *args: str) -> dict[str, Any]:
    proc = omnirtctl(controller.address, "bench", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def jobs_of_run(controller: Controller, run: str) -> list[Any]:
    with Client(controller.address) as client:
        return [j for j in client.list_jobs(model="null") if j.labels.get("run") == run]


def test_reports_what_it_measured_and_not_the_warmup(controller: Controller, worker: Worker) -> None:
    run = uuid.uuid4().hex
    # Concurrency stays within the queue: a burst of MAX_QUEUE + 1 requests that lands before the
    # controller dispatched the first would meet RESOURCE_EXHAUSTED, which this test is not about.
    data = bench_json(
        controller,
        *("--model", "null", "--prompt", "x", "--steps", "2", "--label", f"run={run}"),
        *("--extra", '{"sleep_ms_per_step": 5}'),
        *("--total", "12", "--concurrency", str(MAX_QUEUE), "--warmup", "3"),
    )
    assert (data["planned"], data["total"], data["ok"], data["failed"], data["not_sent"]) == (
        12,
        12,
        12,
        0,
        0,
    )
    assert data["stopped_by"] == "total" and data["failures"] == {} and data["cancelled_jobs"] == 0
    assert data["warmup"] == {"planned": 3, "total": 3, "ok": 3, "stopped_by": "total"}
    assert data["models"] == ["null"] and data["concurrency"] == MAX_QUEUE
    latency = data["latency_ms"]
    assert latency["count"] == 12
    assert 0 < latency["p50"] <= latency["p95"] <= latency["p99"] <= latency["max"]
    # The null model reports one progress event per step: every request has a first progress,
    # which comes before its end.
    ttfp = data["ttfp_ms"]
    assert ttfp["count"] == 12 and 0 < ttfp["p50"] <= ttfp["p95"] <= latency["max"]
    assert data["queue_wait_ms"]["count"] == 12 and data["queue_wait_ms"]["p50"] >= 0
    assert data["execution_ms"]["count"] == 12
    assert data["batch_size_mean"] >= 1 and 0 <= data["batched_share"] <= 1
    assert data["wall_s"] > 0 and data["throughput_per_s"] == pytest.approx(12 / data["wall_s"], rel=0.01)
    # The warmup requests ran on the controller too; they are only left out of the numbers.
    jobs = jobs_of_run(controller, run)
    assert len(jobs) == 15 and all(j.state.value == "succeeded" for j in jobs)


def test_human_report_is_a_table(controller: Controller, worker: Worker) -> None:
    proc = omnirtctl(
        controller.address, "bench", "-m", "null", "-p", "x", "--total", "5", "--concurrency", "2"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "requests     5 sent · 5 ok · 0 failed · 0 not sent (of 5)" in lines
    assert "failures     none" in lines
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["p50", "p95", "p99", "mean", "max", "n"]
    names = ("latency", "first progress", "queue wait", "execution")
    assert [row[: len(name)] for row, name in zip(table[1:], names, strict=True)] == list(names)
    assert all(row.split()[-1] == "5" for row in table[1:])  # 5 samples each
    assert proc.stderr == ""  # no bar without a terminal


@pytest.mark.parametrize(
    ("args", "status", "words"),
    [
        (["--model", "null", "--prompt", "x", "--width", "65"], "INVALID_ARGUMENT", "width"),
        (["--model", "no-such-model", "--prompt", "x"], "NOT_FOUND", "no-such-model"),
    ],
)
def test_failed_requests_are_counted_by_status(
    controller: Controller, worker: Worker, args: list[str], status: str, words: str
) -> None:
    data = bench_json(controller, *args, "--total", "4", "--concurrency", "2")
    assert (data["total"], data["ok"], data["failed"]) == (4, 0, 4)
    assert data["failures"] == {status: 4}
    assert words in data["failure_examples"][status]
    assert data["latency_ms"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
        "mean": None,
        "max": None,
    }
    assert data["batch_size_mean"] is None and data["throughput_per_s"] == 0


def test_a_full_queue_is_counted_as_resource_exhausted(controller: Controller, worker: Worker) -> None:
    # One slot, two queue places, eight callers with one-second jobs: most submits are refused.
    data = bench_json(
        controller,
        *("--model", "null", "--prompt", "x", "--steps", "2", "--extra", '{"sleep_ms_per_step": 500}'),
        *("--total", "16", "--concurrency", "8"),
    )
    assert data["total"] == 16 and data["ok"] + data["failed"] == 16
    assert data["ok"] >= 1 and data["failures"].get("RESOURCE_EXHAUSTED", 0) >= 1
    assert set(data["failures"]) == {"RESOURCE_EXHAUSTED"}
    assert data["latency_ms"]["count"] == data["ok"]


def test_duration_stops_a_long_load_and_cancels_what_still_runs(
    controller: Controller, worker: Worker
) -> None:
    run = uuid.uuid4().hex
    # 1000 jobs of 5 s each would take over an hour; the limit ends it after 1 s plus 0.5 s grace.
    data = bench_json(
        controller,
        *("--model", "null", "--prompt", "x", "--steps", "10", "--extra", '{"sleep_ms_per_step": 500}'),
        *(
            "--label",
            f"run={run}",
            "--total",
            "1000",
            "--concurrency",
            "2",
            "--duration",
            "1",
            "--grace",
            "0.5",
        ),
    )
    assert data["stopped_by"] == "duration" and data["planned"] == 1000
    assert 1 <= data["total"] < 1000 and data["not_sent"] == 1000 - data["total"]
    assert data["ok"] + data["failed"] == data["total"]
    assert data["failures"].get("UNFINISHED", 0) >= 1 and data["cancelled_jobs"] >= 1
    # Nothing is left running for nobody.
    jobs = jobs_of_run(controller, run)
    assert len(jobs) == data["total"]
    assert Counter(j.state.value for j in jobs)["cancelled"] == data["cancelled_jobs"]
    assert all(j.state.terminal for j in jobs)


def test_request_file_is_used_round_robin(controller: Controller, worker: Worker, tmp_path: Path) -> None:
    run = uuid.uuid4().hex
    lines = [
        {"model": "null", "prompt": "a", "task": "text2image", "labels": {"run": run, "variant": "a"}},
        {"model": "null", "prompt": "b", "numInferenceSteps": 3, "labels": {"run": run, "variant": "b"}},
    ]
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    data = bench_json(controller, "--request-file", str(path), "--total", "6", "--concurrency", "2")
    assert (data["total"], data["ok"], data["request_variants"]) == (6, 6, 2)
    jobs = jobs_of_run(controller, run)
    assert Counter(j.labels["variant"] for j in jobs) == {"a": 3, "b": 3}


def test_unreachable_controller_is_one_line_and_non_zero() -> None:
    nowhere = f"127.0.0.1:{free_port()}"  # a port nothing listens on
    proc = omnirtctl(nowhere, "bench", "-m", "null", "-p", "x", "--total", "1")
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: UNAVAILABLE") and nowhere in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
