"""`python -m bench.control_plane --secure` run as a user runs it, on a tiny load: the secured
stack is really secured (the bench checks what it refuses before it measures), every call of
both stacks succeeds, and the report puts secure beside plain in the same rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_secure_runs_beside_plain_in_every_round_and_is_refused_without_key_or_tls(tmp_path: Path) -> None:
    out = tmp_path / "cp.json"
    flags = ["--total", "60", "--concurrency", "8", "--rounds", "2", "--warmup", "5", "--workers", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.control_plane", *flags, "--slots", "4", "--secure", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "median secure (TLS + API key + worker token)" in done.stdout
    assert "secure/plain throughput x" in done.stdout
    report = json.loads(out.read_text())
    assert report["secure_refusals"] == {
        "grpc_without_key": "UNAUTHENTICATED",
        "grpc_plaintext": "UNAVAILABLE",
        "http_without_key": "HTTP_401",
    }
    for numbers in report["rounds"]:
        for name in ("omnirt", "omnirt_secure", "omnirt_http", "omnirt_secure_http", "echo"):
            assert numbers[name]["ok"] == 60 and numbers[name]["failures"] == {}, (name, numbers[name])
        assert numbers["secure_ratio"] > 0 and numbers["secure_controller_cpu_ratio"] > 0
        # The controller's loop thread is measured apart from gRPC's own threads.
        assert numbers["omnirt_secure"]["controller_loop_us_per_call"] > 0
    # The secured workers (bench-s*) served the secured controller's calls, over TLS with the token.
    assert set(report["rounds"][0]["omnirt_secure"]["cpu_cores_used"]) == {
        "controller",
        "worker-bench-s0",
        "load_process",
    }
    assert report["median"]["secure_ratio"] > 0 and report["median"]["secure_http_ratio"] > 0
