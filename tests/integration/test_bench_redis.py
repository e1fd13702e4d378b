"""The suite's `redis` scenario, run as a user runs it (`python -m bench.suite --only redis`) on tiny loads.

It checks that both engines ran and that the Redis costs were read from the server and reach
the JSON, the table and the docs page; never how fast anything is.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench import redis_engine
from tests.integration.test_bench_suite import run_module
from tests.tools import require_tool


def test_quick_redis_runs_both_engines_and_reads_what_jobs_cost_redis(
    tmp_path: Path, model_dir: Path
) -> None:
    require_tool("redis-server", shutil.which("redis-server"), "apt-get install redis-server")
    out, docs = tmp_path / "suite.json", tmp_path / "BENCHMARKS.md"
    done = run_module(
        "bench.suite", "--quick", "--only", "redis", "--json", str(out), "--docs", str(docs),
        "--model-dir", str(model_dir), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    entry = json.loads(out.read_text())["scenarios"]["redis"]
    assert entry["status"] == "ok", entry
    assert [w["workload"] for w in entry["workloads"]] == ["null", "tiny-sd"]
    for workload in entry["workloads"]:
        s = workload["summary"]
        assert s["memory_per_s"] > 0 and s["redis_per_s"] > 0, s
        assert not s["memory_failures"] and not s["redis_failures"], s
        (load,) = workload["rounds"]  # --quick: one round, memory then redis
        assert s["ratio"] == pytest.approx(load["redis"]["per_s"] / load["memory"]["per_s"], abs=0.002)
        # Read from Redis over the measured calls: commands, CPU, memory of the finished jobs.
        assert s["commands_per_job"] > 0 and s["top_commands_per_job"], s
        assert "INFO" not in load["redis"]["redis_server"]["commands"], "the bench's own reads"
        assert s["redis_cpu_ms_per_job"] > 0 and s["shard_ceiling_jobs_per_s"] > 0, s
        assert s["kib_per_job"] > 0 and s["keys_per_job"] > 0, s
        assert s["memory_controller_cpu_ms_per_job"] > 0 and s["redis_controller_cpu_ms_per_job"] > 0, s
        assert "redis_server" not in load["memory"]
    assert entry["workloads"][1]["artifact_bytes"] > 0, "tiny-sd's PNG came back inline"
    targets = [(r["case"], r["target"]) for r in entry["rows"] if r["target"]]
    assert targets == [
        ("null c64: Redis / memory jobs/s (p50)", ">= 0.6"),
        ("null: Redis commands per job (ratio = the count)", "<= 30"),
        ("null: Redis CPU ms per job (ratio = the ms)", "<= 0.25"),
        ("tiny-sd 64x64 2 steps c8: Redis / memory jobs/s (p50)", ">= 0.6"),
        ("tiny-sd: Redis commands per job (ratio = the count)", "<= 30"),
        ("tiny-sd: Redis CPU ms per job (ratio = the ms)", "<= 0.25"),
    ]
    assert "redis     null c64: Redis / memory jobs/s" in done.stdout  # the printed table
    page = docs.read_text()
    assert "## `redis`" in page and "shard ceiling" in page
    null = entry["workloads"][0]["summary"]
    assert f"**{null['redis_cpu_ms_per_job']:.3f} ms**" in page  # the summary table, from the JSON
    # An entry merged into the page's results from a run of its own says so on the page.
    assert "Recorded apart" not in page
    entry["separate_run"] = "python -m bench.suite --only redis --json FILE"
    note = "Recorded apart from the rest of this page, with `python -m bench.suite --only redis --json FILE`."
    assert redis_engine.markdown(entry).startswith(note)
