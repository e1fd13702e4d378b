"""The benchmark suite and the GPU script, run as a user runs them (`python -m bench....`), on tiny loads.

They check that the commands work and report what they measured (JSON keys, the table, the docs
page written from the JSON), never how fast anything is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench._scenario import fmt_ms

ROOT = Path(__file__).resolve().parents[2]


def run_module(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m ARGS` in a session of its own: past `timeout` the whole group is killed, the
    daemons the benchmark started included (a plain kill would leave them running)."""
    with subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_quick_overhead_writes_json_table_and_docs(tmp_path: Path, model_dir: Path) -> None:
    out, docs = tmp_path / "suite.json", tmp_path / "BENCHMARKS.md"
    done = run_module(
        "bench.suite",
        "--quick",
        "--only",
        "overhead",
        "--json",
        str(out),
        "--docs",
        str(docs),
        "--model-dir",
        str(model_dir),
    )
    assert done.returncode == 0, done.stderr[-4000:]

    results = json.loads(out.read_text())
    assert results["quick"] is True and results["torch_threads"] == 1
    assert {"nproc", "cpu_model", "git_commit", "packages"} <= set(results["machine"])
    entry = results["scenarios"]["overhead"]
    assert entry["status"] == "ok", entry
    (case,) = entry["cases"]
    assert case["size"] == "64x64" and case["steps"] == 4
    assert len(case["direct_ms"]) == len(case["omnirt_ms"]) == entry["settings"]["calls"]
    assert case["direct_p50_ms"] > 0 and case["omnirt_p50_ms"] > 0
    # The floor next to it: a null-model job through the same stack, and the export stage.
    assert 0 < case["null_round_trip_p50_ms"] < case["omnirt_p50_ms"]
    # ... and after a pause as long as the direct call, with a bare gRPC echo beside it.
    assert 0 < case["null_after_pause_p50_ms"] < case["omnirt_p50_ms"]
    assert min(case["echo_round_trip_p50_ms"], case["echo_after_pause_p50_ms"]) > 0
    assert 0 < case["worker_export_p50_ms"] < case["worker_execution_p50_ms"]
    assert case["ratio"] == pytest.approx(case["omnirt_p50_ms"] / case["direct_p50_ms"], rel=0.01)
    # Both sides did the same work: the served image is the direct call's, pixel for pixel.
    assert case["same_pixels_max_diff"] == 0
    # The pure serving overhead too: over the direct call in inference mode, as the worker runs it.
    assert case["direct_inference_mode_p50_ms"] > 0
    direct_im = case["direct_inference_mode_p50_ms"]
    assert case["ratio_to_inference_mode"] == pytest.approx(case["omnirt_p50_ms"] / direct_im, rel=0.01)
    row, alone = entry["rows"]
    assert row["target"] == "<= 1.05" and row["verdict"] == ("met" if case["ratio"] <= 1.05 else "missed")
    assert alone["ratio"] == case["ratio_to_inference_mode"] and not alone["target"]

    assert "overhead  tiny-sd 64x64, 4 steps, c1: p50 latency" in done.stdout  # the printed table
    page = docs.read_text()
    assert "## `overhead`" in page and "These numbers come from a `--quick` run" in page
    assert f"direct {fmt_ms(case['direct_p50_ms'])}" in page  # the summary row, from the JSON
    assert f"the null round trip alone is {fmt_ms(case['null_round_trip_p50_ms'])}" in page
    assert f"| {fmt_ms(case['null_after_pause_p50_ms'])} | {fmt_ms(case['echo_round_trip_p50_ms'])} |" in page

    # The page is a function of the JSON alone: rewriting it from the file gives the same text.
    again = tmp_path / "again.md"
    rerender = run_module(
        "bench.report", "--suite", str(out), "--gpu", str(tmp_path / "none.json"), "--out", str(again)
    )
    assert rerender.returncode == 0, rerender.stderr
    assert again.read_text() == page


def test_quick_export_times_the_workers_png_next_to_pillows_default(tmp_path: Path) -> None:
    out, docs = tmp_path / "suite.json", tmp_path / "BENCHMARKS.md"
    done = run_module("bench.suite", "--quick", "--only", "export", "--json", str(out), "--docs", str(docs))
    assert done.returncode == 0, done.stderr[-4000:]
    entry = json.loads(out.read_text())["scenarios"]["export"]
    assert entry["status"] == "ok", entry
    (case,) = entry["cases"]
    assert case["size"] == "256x256"
    assert min(case["pillow_default_p50_ms"], case["pillow_level1_p50_ms"], case["omnirt_p50_ms"]) > 0
    assert case["time_ratio"] == pytest.approx(
        case["omnirt_p50_ms"] / case["pillow_default_p50_ms"], rel=0.01
    )
    assert case["bytes_ratio"] == pytest.approx(
        case["omnirt_bytes"] / case["pillow_default_bytes"], abs=0.001
    )
    batch = entry["batch"]
    assert batch["images"] == 4 and min(batch["one_by_one_p50_ms"], batch["at_once_p50_ms"]) > 0
    assert [r["case"] for r in entry["rows"]] == [
        "PNG of a 256x256 photo-like image: encode p50",
        "PNG of 4 images 256x256: the batch's export p50",
    ]
    page = docs.read_text()
    assert "## `export`" in page and f"{fmt_ms(case['omnirt_p50_ms'])}, " in page


def test_peers_without_ray_is_skipped_and_says_how_to_install(tmp_path: Path, model_dir: Path) -> None:
    out = tmp_path / "peers.json"
    done = run_module(
        "bench.suite",
        "--quick",
        "--only",
        "peers",
        "--json",
        str(out),
        "--no-docs",
        "--model-dir",
        str(model_dir),
        env={"OMNIRT_BENCH_RAY_PYTHON": str(tmp_path / "no-such-venv" / "bin" / "python")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    entry = json.loads(out.read_text())["scenarios"]["peers"]
    assert entry["status"] == "skipped" and "bash bench/ray/setup.sh" in entry["reason"]
    table_row = next(line for line in done.stdout.splitlines() if line.startswith("peers "))
    assert table_row.rstrip().endswith("skipped")


def test_unknown_scenario_is_a_usage_error() -> None:
    done = run_module("bench.suite", "--only", "overhead,warp-drive", timeout=60)
    assert done.returncode == 2
    assert "unknown scenario(s) warp-drive" in done.stderr and "overhead" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_gpu_script_without_cuda_says_so_and_exits_0(tmp_path: Path) -> None:
    done = run_module("bench.gpu", "--json", str(tmp_path / "gpu.json"), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no CUDA GPU on this machine" in done.stdout
    assert not (tmp_path / "gpu.json").exists()


def test_gpu_script_smoke_runs_the_whole_flow_on_the_cpu(tmp_path: Path) -> None:
    """`--smoke`: the GPU script's own code (build from configs, catalog, workers, every case)."""
    out = tmp_path / "gpu.json"
    done = run_module("bench.gpu", "--smoke", "--calls", "1", "--batch-calls", "4", "--json", str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["smoke"] is True and list(results["models"]) == ["sd15", "sdxl", "flux", "wan"]
    for name, model in results["models"].items():
        assert model["overhead"]["direct_p50_ms"] > 0 and model["overhead"]["omnirt_p50_ms"] > 0, name
        batching = model["batching"]
        assert batching["off"]["ok"] == batching["on"]["ok"] == 4, name
        assert batching["off"]["mean_batch_size"] == 1.0, name  # gpu-NAME-single never batches
    assert set(results["models"]["sdxl"]["parameters"]) == {"unet", "vae", "text_encoder", "text_encoder_2"}
    assert results["models"]["wan"]["request"]["num_frames"] == 5
    assert "only 2 of its layers are built" in results["models"]["flux"]["text_encoder_note"]

    # The step cache case, on the transformer models only: the worker applied the cache (it
    # skipped attention computations) and the cached output differs from the uncached one.
    assert "step_cache" not in results["models"]["sd15"] and "step_cache" not in results["models"]["sdxl"]
    for name in ("flux", "wan"):
        cache = results["models"][name]["step_cache"]
        assert cache["applied"] == {"kind": "first_block", "threshold": 1.0}, name
        assert cache["attention_skipped"] > 0, name
        assert cache["cached_p50_ms"] > 0 and cache["uncached_p50_ms"] > 0, name
        assert cache["psnr_db"] is not None and cache["other_seed_psnr_db"] is not None, name

    # CFG parallel on 2 gloo ranks, for flux only in --smoke (true CFG: two denoiser calls a
    # step, one per rank): each rank computed only part of the calls, the image is the one
    # process's, bit for bit.
    cfg = results["models"]["flux"]["cfg_parallel"]
    assert cfg["status"] == "ok" and cfg["parallel"] == "cfg", cfg
    assert cfg["request"]["extra"] == {"true_cfg_scale": 4.0}
    ranks = cfg["guidance_split"]
    assert [r["pattern"] for r in ranks] == ["sequential", "sequential"], ranks
    assert all(0 < r["computed_calls"] < r["denoiser_calls"] for r in ranks), ranks
    assert cfg["psnr_vs_one_process_db"] is None  # identical
    for name in ("sd15", "sdxl", "wan"):
        skipped = results["models"][name]["cfg_parallel"]
        assert skipped["status"] == "skipped" and "--cfg-models" in skipped["reason"], name

    # The continuous case on SDXL: the same open loop to whole-request batching and step-level.
    steps = results["continuous"]
    assert steps["status"] == "ok", steps
    (case,) = steps["cases"]
    assert case["model"] == "gpu-sdxl" and [p["load"] for p in case["points"]] == [0.8, 1.3]
    for point in case["points"]:
        assert set(point) >= {"whole", "step"} and "none" not in point
        for mode in ("whole", "step"):
            assert point[mode]["done"] == point[mode]["offered"] == 8 and not point[mode]["failures"], point

    table = done.stdout
    assert "80% load: p99, step vs whole" in table and "130% load: throughput, step vs whole" in table
    assert "flux   step cache first_block threshold 1.0: p50 (speed-up)" in table
    assert "flux   CFG on 2 ranks vs 1 process: p50 (speed-up)" in table
    assert "sd15   CFG on 2 ranks" in table and "skipped: not in --cfg-models (flux)" in table


def test_quick_continuous_sends_an_open_loop_to_each_mode(tmp_path: Path, model_dir: Path) -> None:
    out, docs = tmp_path / "suite.json", tmp_path / "BENCHMARKS.md"
    done = run_module(
        "bench.suite", "--quick", "--only", "continuous", "--json", str(out), "--docs", str(docs),
        "--model-dir", str(model_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    entry = json.loads(out.read_text())["scenarios"]["continuous"]
    assert entry["status"] == "ok", entry
    (case,) = entry["cases"]
    assert case["model"] == "tiny-sd" and case["capacity_per_s"] > 0
    assert [p["load"] for p in case["points"]] == [0.5, 1.3]
    assert case["step_ms"] > 0
    for point in case["points"]:
        for mode in ("none", "whole", "step"):
            run = point[mode]
            assert run["done"] == run["offered"] == entry["settings"]["jobs"] and not run["failures"]
            assert 0 < run["first_step_p50_ms"] <= run["p50_ms"] <= run["p99_ms"]
        assert point["none"]["mean_jobs_per_call"] == 1.0, "no batching: one job per call"
        assert point["step"]["mean_rows_per_step"] >= 2, "each job's rows, at least"
    # At 130 % the step engine's targets: throughput against whole, and the urgent first step.
    assert [r["case"].split(": ", 1)[1] for r in entry["rows"]] == [
        "throughput, step vs whole",
        "urgent first step, in step times",
    ]
    page = docs.read_text()
    assert "## `continuous`" in page and "capacity of **whole**" in page
