"""`python -m bench.realtime` run as a user runs it, on a tiny load: the command works, writes its
JSON and table, and every figure is there and makes sense (what is measured, not how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import realtime

ROOT = Path(__file__).resolve().parents[2]
SESSION_FIELDS = {
    "ready_ms_p50", "first_chunk_ms_p50", "first_chunk_ms_p99", "latency_ms_p50", "latency_ms_p99",
    "client_gap_ms_p50", "client_gap_ms_p99", "client_latency_ms_p50", "client_latency_ms_p99",
    "rtf_wall_p50", "rtf_wall_min", "lag_max_ms",
}  # fmt: skip


def test_realtime_bench_streams_sessions_and_measures_the_relay_and_speech(tmp_path: Path) -> None:
    out = tmp_path / "realtime.json"
    args = ["--chunks", "2", "--concurrency", "1,2", "--paced", "1", "--relay-chunks", "2"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.realtime", *args, "--speech-calls", "2", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "OmniRT's added time per chunk vs the pipeline in-process" in done.stdout
    result = json.loads(out.read_text())
    assert result["session_slots"] == 4
    runs = {(r["mode"], r["concurrency"]): r for r in result["sessions"]}
    assert set(runs) == {("fast", 1), ("fast", 2), ("paced", 1)}
    for (_, concurrency), r in runs.items():
        assert set(r) >= SESSION_FIELDS, SESSION_FIELDS - set(r)
        assert r["in_order"] and r["reasons"] == ["ended"]
        assert r["report"]["chunks_out"] == 2 * concurrency
        assert 0 < r["first_chunk_ms_p50"] <= r["first_chunk_ms_p99"]
        assert 0 < r["latency_ms_p50"] <= r["latency_ms_p99"]
        assert r["rtf_wall_min"] > 0 and r["report"]["real_time_factor_min"] > 0
        assert r["lag_max_ms"] >= 0 and r["report"]["underruns"] >= 0
    # In real time the second chunk leaves about 1.12 s after the first was sent.
    assert runs["paced", 1]["client_gap_ms_p50"] > 500
    relay = result["relay"]
    assert relay["rounds"] == 2 and relay["chunks_out"] == 3  # and the warm-up chunk
    assert relay["direct_ms_p50"] > 0 and relay["worker_push_ms_mean"] > 0
    # The client's wait for a chunk holds the worker's time for it, and the relay on top.
    assert relay["omnirt_ms_p50"] >= relay["worker_latency_ms_p50"] > 0
    assert relay["added_ms_min"] <= relay["added_ms_p50"] <= relay["added_ms_max"]
    speech = result["speech"]
    assert speech["calls"] == 2 and speech["audio_ms_p50"] > 0 and speech["bytes_p50"] > 44
    assert 0 < speech["first_byte_ms_p50"] <= speech["last_byte_ms_p50"]
    # Its section of docs/BENCHMARKS.md is written from the JSON alone.
    assert "**The relay's cost**: one session, 2 rounds" in realtime.markdown(result)
    target = [r for r in result["rows"] if r["target"]]
    assert [r["target"] for r in target] == ["added <= 5 ms"] and target[0]["verdict"] in ("met", "missed")
