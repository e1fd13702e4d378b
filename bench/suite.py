"""The benchmark suite: every scenario in one run, one table, one JSON file, and docs/BENCHMARKS.md.

    python -m bench.suite                      # the full run (~10-20 min on 2 cores): writes
                                               # bench/results/suite.json and docs/BENCHMARKS.md
    python -m bench.suite --quick              # small counts (~2-3 min), a smoke check: prints the
                                               # table, writes only what --json/--docs ask for
    python -m bench.suite --only overhead,batching --json out.json

Scenarios: overhead, control_plane, batching, continuous, peers, cold_warm, dispatch, fair_share, export,
step_cache, realtime, redis. Each starts its own daemons on loopback and stops them (export and
step_cache need none: they run in-process). A scenario that cannot run here (Ray
Serve not installed for `peers`) is reported as skipped; one that fails is reported as failed
with its daemons' log tails, the others still run. Exit status: 0 when no scenario failed, 1
otherwise, 2 for bad arguments. Missed targets are results, not failures: the table says met /
missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from . import (
    _machine,
    batching,
    cold_warm,
    continuous,
    control_plane_scenarios,
    export,
    fair_share,
    overhead,
    peers,
    realtime,
    redis_engine,
    report,
    step_cache,
)
from . import _scenario as sc

SCENARIOS: dict[str, sc.Scenario] = {
    s.name: s
    for s in (
        overhead.SCENARIO,
        control_plane_scenarios.CONTROL_PLANE,
        batching.SCENARIO,
        continuous.SCENARIO,
        peers.SCENARIO,
        cold_warm.SCENARIO,
        control_plane_scenarios.DISPATCH,
        fair_share.SCENARIO,
        export.SCENARIO,
        step_cache.SCENARIO,
        realtime.SCENARIO,
        redis_engine.SCENARIO,
    )
}
RESULTS = _machine.ROOT / "bench" / "results"
DEFAULT_JSON = RESULTS / "suite.json"
DEFAULT_DOCS = _machine.ROOT / "docs" / "BENCHMARKS.md"
PACKAGES = ("grpcio", "protobuf", "torch", "diffusers", "transformers", "aiohttp")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke check in ~2-3 minutes")
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios (default all): {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--json", type=Path, help=f"write the results here (default for a full run: {_rel(DEFAULT_JSON)})"
    )
    parser.add_argument(
        "--docs",
        type=Path,
        help=f"regenerate this markdown file (default for a full run: {_rel(DEFAULT_DOCS)})",
    )
    parser.add_argument("--no-docs", action="store_true", help="never write the markdown file")
    parser.add_argument(
        "--gpu-json",
        type=Path,
        default=RESULTS / "gpu.json",
        help="results of `python -m bench.gpu` to include in the docs, if the file exists",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch CPU threads, in-process and per worker (default 1)",
    )
    parser.add_argument("--model-dir", type=Path, help="tiny models folder (default: a fresh temporary one)")
    parser.add_argument("--keep-logs", type=Path, help="copy the daemons' logs into this folder")
    return parser.parse_args(argv)


def _rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(_machine.ROOT))
    return str(path)


def selected(only: str) -> list[sc.Scenario]:
    """The scenarios named in `--only` (all when empty), in the suite's order; ValueError for others."""
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"--only: unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    return [s for s in SCENARIOS.values() if not names or s.name in names]


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def quiet_libraries() -> None:
    """No progress bars or warnings from diffusers/transformers in this process (the daemons keep
    theirs), nor the import-time noise the worker filters too (torchao's CUDA kernels on a CPU)."""
    from omnirt.worker.runtime import quantization

    quantization.quiet_import_logs()  # before diffusers imports torchao
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    for lib in (diffusers_logging, transformers_logging):
        lib.set_verbosity_error()
        lib.disable_progress_bar()


def build_models(model_dir: Path) -> dict[str, float]:
    """Build tiny-sd into `model_dir` (what a worker's first start does); seconds taken."""
    from omnirt.worker.tiny import registry as tiny_models

    quiet_libraries()
    started = time.perf_counter()
    tiny_models.ensure_builtin("tiny-sd", model_dir)
    return {"tiny-sd": round(time.perf_counter() - started, 2)}


def run_one(scenario: sc.Scenario, settings: Any, ctx: sc.Context) -> dict[str, Any]:
    """Run one scenario; never raises: a failure or a skip is recorded in the entry."""
    print(f"== {scenario.name}: {scenario.title}", flush=True)
    entry: dict[str, Any] = {"title": scenario.title, "loadavg_before": list(os.getloadavg())}
    started = time.perf_counter()
    try:
        entry.update(scenario.run(settings, ctx))
        entry["status"] = "ok"
    except sc.Skipped as skip:
        entry.update(status="skipped", reason=str(skip))
        print(f"   skipped: {skip}", flush=True)
    except Exception as exc:
        entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        print(f"   FAILED: {entry['reason']}\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        for log in sorted(ctx.log_dir.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
    entry["wall_s"] = round(time.perf_counter() - started, 1)
    entry["loadavg_after"] = list(os.getloadavg())
    print(f"   {entry['status']} in {entry['wall_s']} s", flush=True)
    return entry


def run_suite(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    scenarios = selected(args.only)
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "suite_version": 1,
        "command": shlex.join([".venv/bin/python", "-m", "bench.suite", *argv]),
        "quick": args.quick,
        "started_at": started_at.isoformat(timespec="seconds"),
        "machine": {**_machine.describe(), "packages": versions()},
        "torch_threads": args.torch_threads,
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="omnirt-suite-") as tmp:
        model_dir = args.model_dir or Path(tmp) / "models"
        if any(s.needs_models for s in scenarios):
            results["model_build_s"] = build_models(model_dir)
        for scenario in scenarios:
            log_dir = Path(tmp) / scenario.name
            log_dir.mkdir()
            ctx = sc.Context(log_dir=log_dir, model_dir=model_dir, torch_threads=args.torch_threads)
            settings = scenario.quick if args.quick else scenario.full
            results["scenarios"][scenario.name] = run_one(scenario, settings, ctx)
        if args.keep_logs:
            _copy_logs(Path(tmp), args.keep_logs)
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results


def _copy_logs(source: Path, target: Path) -> None:
    for log in source.glob("*/*.log"):
        dest = target / log.parent.name / log.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(log.read_bytes())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    try:
        selected(args.only)
    except ValueError as exc:
        print(f"python -m bench.suite: error: {exc}", file=sys.stderr)
        return 2
    full_run = not args.quick and not args.only
    # The page is made from what the JSON holds (dict keys become strings there), so that
    # `python -m bench.report` rewrites it from the file word for word.
    results = json.loads(json.dumps(run_suite(args, argv)))
    print()
    print(report.summary_text(results))
    json_path = args.json or (DEFAULT_JSON if full_run else None)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nresults: {json_path}")
    docs_path = args.docs or (DEFAULT_DOCS if full_run else None)
    if docs_path and not args.no_docs:
        gpu = json.loads(args.gpu_json.read_text()) if args.gpu_json and args.gpu_json.exists() else None
        docs_path.write_text(report.render(results, gpu))
        print(f"docs: {docs_path}")
    failed = [n for n, e in results["scenarios"].items() if e["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
