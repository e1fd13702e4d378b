"""`python -m bench.fair_share` run as a user runs it, on a tiny load: the command works, writes
its JSON and table, and shows what it is for (the order, not how fast anything is)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_fair_share_bench_compares_a_single_jobs_wait_with_fifo(tmp_path: Path) -> None:
    out = tmp_path / "fair.json"
    args = ["--flood", "40", "--warmup", "5", "--job-ms", "20", "--slots", "1", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.fair_share", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "one job of another tenant behind a flood of 40, 1 slots" in done.stdout
    result = json.loads(out.read_text())
    fifo, fair = result["modes"]["fifo"], result["modes"]["fair"]
    assert fifo["tenants"] == ["", ""] and fair["tenants"] == ["single", "flood"]
    # FIFO: the single job waits for the flood jobs still queued; fair share: about one at most.
    assert fifo["flood_jobs_ahead"] >= fifo["flood_queued_when_single_came"] - 1 > 20
    assert fair["flood_jobs_ahead"] <= 2 < fair["flood_queued_when_single_came"]
    assert [r["case"] for r in result["rows"]][1] == "that wait in job run times (fair share)"
