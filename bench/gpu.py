"""The GPU variant: Stable Diffusion 1.5-sized and Wan 2.1 1.3B-sized pipelines, direct vs OmniRT.

    python -m bench.gpu                 # on a CUDA machine (sized for ~5-8 min on an H100-class GPU)
    python -m bench.gpu --smoke         # the same code on the CPU with shrunk models (a check)

On a machine without CUDA it says so and exits 0. Otherwise it builds both pipelines with
random weights from their published configs (bench/gpu_configs.json; no hub), saves them, and
starts one controller and one `omnirt-worker --backend cuda --slots 1` serving them. Per model:

- overhead: the same request (SD 512x512 / Wan 832x480 with 17 frames; 20 steps; fixed seed)
  called directly in this process (loaded the way the worker loads it) and through
  `Client.generate`, alternating, `--calls` times each after one warm-up each; medians, ratio;
- batching: `--batch-calls` calls at concurrency `--concurrency` through `gpu-NAME-single`
  (supports_batching = false) and `gpu-NAME` (batching, up to 4 per call), the same weights.

Results go to bench/results/gpu.json and, when bench/results/suite.json exists, into
docs/BENCHMARKS.md (its GPU section), the way the suite records its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import omnirt

from . import _gpu_models as models
from . import _machine
from . import _scenario as sc
from ._daemons import Controller, Worker
from ._stacks import wait_connected
from .batching import measure

RESULTS = _machine.ROOT / "bench" / "results"
PROMPT = "a sailing boat on a calm sea at sunrise"
SEED = 7
DEFAULT_CALLS = {"sd15": 5, "wan": 3}
DEFAULT_BATCH_CALLS = {"sd15": 8, "wan": 4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="sd15,wan", help="models: sd15, wan (default both)")
    parser.add_argument("--calls", type=int, default=0, help="timed calls per side (default: sd15 5, wan 3)")
    parser.add_argument("--batch-calls", type=int, default=0, help="calls per batching mode (sd15 8, wan 4)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrency of the batching runs")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch CPU threads here and in the worker (4; --smoke 1)"
    )
    parser.add_argument("--smoke", action="store_true", help="run on the CPU with shrunk models (a check)")
    parser.add_argument("--model-dir", type=Path, help="where to build the models (default: a temporary one)")
    parser.add_argument(
        "--json", type=Path, help="results file (default bench/results/gpu.json; --smoke: none)"
    )
    parser.add_argument("--no-docs", action="store_true", help="do not regenerate docs/BENCHMARKS.md")
    return parser.parse_args(argv)


def gpu_facts(device: str) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda or ""}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        facts.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpus=torch.cuda.device_count(),
        )
    return facts


def _overhead(
    pipeline: Any, client: omnirt.Client, model: str, request: dict[str, Any], calls: int
) -> dict[str, Any]:
    import torch

    device = pipeline.device

    def direct() -> None:
        pipeline(prompt=PROMPT, generator=torch.Generator(device).manual_seed(SEED), **request)
        if device.type == "cuda":
            torch.cuda.synchronize()

    def served() -> omnirt.GenerateResult:
        return client.generate(model=model, prompt=PROMPT, seed=SEED, timeout=1800)

    t0 = time.perf_counter()
    first = served()  # the worker's first call loads the model
    cold_ms = sc.ms(time.perf_counter() - t0)
    direct()
    direct_s, omnirt_s, execution_ms = [], [], []
    for _ in range(calls):
        t0 = time.perf_counter()
        direct()
        direct_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = served()
        omnirt_s.append(time.perf_counter() - t0)
        execution_ms.append(result.report.execution_ms)
    d50, o50 = sc.median(direct_s), sc.median(omnirt_s)
    export = result.report.timing("export")
    return {
        "calls": calls,
        "direct_p50_ms": sc.ms(d50),
        "omnirt_p50_ms": sc.ms(o50),
        "ratio": sc.ratio(o50, d50),
        "overhead_p50_ms": sc.ms(o50 - d50),
        "worker_execution_p50_ms": round(sc.median(execution_ms), 1),
        "export_ms": round(export or 0.0, 1),
        "first_call_ms": cold_ms,
        "first_call_load_ms": round(first.report.timing("load") or 0.0, 1),
        "dtype": result.report.dtype,
        "device": result.report.device,
    }


def run_model(
    name: str, spec: dict[str, Any], path: Path, address: str, args: argparse.Namespace, device: str
) -> dict[str, Any]:
    calls = args.calls or DEFAULT_CALLS[name]
    batch_calls = args.batch_calls or DEFAULT_BATCH_CALLS[name]
    pipeline = models.load(spec, path, device)
    try:
        with omnirt.Client(address) as client:
            overhead = _overhead(pipeline, client, f"gpu-{name}", spec["request"], calls)
    finally:
        del pipeline
        if device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()
    batching = {}
    for mode, model in (("off", f"gpu-{name}-single"), ("on", f"gpu-{name}")):
        request = {"model": model, "prompt": PROMPT}
        # One batch of warm-up: a Wan call takes seconds.
        batching[mode] = asyncio.run(
            measure(address, args.concurrency, batch_calls, request, args.concurrency)
        )
    return {
        "request": spec["request"],
        "dtype": spec["dtype"],
        "overhead": overhead,
        "batching": {
            "concurrency": args.concurrency,
            "calls": batch_calls,
            **batching,
            "throughput_ratio": sc.ratio(batching["on"]["per_s"], batching["off"]["per_s"]),
        },
    }


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Build the models, start the daemons, measure every model; the results as JSON-able data."""
    import torch

    device = "cpu" if args.smoke else "cuda"
    args.torch_threads = args.torch_threads or (1 if args.smoke else 4)
    torch.set_num_threads(args.torch_threads)  # the same as the worker's --torch-threads
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    configs = models.load_configs(smoke=args.smoke)
    results: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "bench.gpu", *argv]),
        "smoke": args.smoke,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**_machine.describe(), **gpu_facts(device)},
        "torch_threads": args.torch_threads,
        "models": {},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="omnirt-gpu-") as tmp:
        model_dir = args.model_dir or Path(tmp) / "models"
        log_dir = Path(tmp) / "logs"
        log_dir.mkdir()
        entries, built = [], {}
        for name in names:
            path = model_dir / f"gpu-{name}"
            t0 = time.perf_counter()
            params = models.build(name, configs[name], path, device)
            built[name] = {"build_s": round(time.perf_counter() - t0, 1), "parameters": params}
            entries += models.catalog_entries(name, configs[name], path)
            print(f"built {name}: {params} in {built[name]['build_s']} s", flush=True)
        catalog = log_dir / "gpu-catalog.json"
        catalog.write_text(json.dumps({"models": entries}))
        controller = Controller(log_dir, "--catalog", str(catalog)).start()
        threads = ("--torch-threads", str(args.torch_threads))
        served = ",".join(e["id"] for e in entries)
        worker = Worker(
            log_dir,
            controller.address,
            "gpu-w0",
            model_dir,
            *threads,
            "--backend",
            device,
            "--slots",
            "1",
            "--models",
            served,
        )
        try:
            worker.start()
            wait_connected(controller, [worker], timeout=600)
            for name in names:
                print(f"measuring {name}", flush=True)
                results["models"][name] = {
                    **built[name],
                    **run_model(
                        name, configs[name], model_dir / f"gpu-{name}", controller.address, args, device
                    ),
                }
        except Exception:
            for daemon in (worker, controller):
                print(f"--- {daemon.name}\n{daemon.log_tail(3000)}", file=sys.stderr)
            raise
        finally:
            worker.stop()
            controller.stop()
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results


def summary_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in results["models"].items():
        o, b = m["overhead"], m["batching"]
        size = f"{m['request']['width']}x{m['request']['height']}"
        frames = f", {m['request']['num_frames']} frames" if "num_frames" in m["request"] else ""
        rows.append(
            [
                name,
                f"{size}{frames}, {m['request']['num_inference_steps']} steps, c1: p50",
                sc.fmt_ms(o["omnirt_p50_ms"]),
                f"direct {sc.fmt_ms(o['direct_p50_ms'])}",
                f"{o['ratio']:.3f}",
            ]
        )
        rows.append(
            [
                name,
                f"c{b['concurrency']}: calls/s, batching on vs off",
                f"{b['on']['per_s']:.2f}/s",
                f"off {b['off']['per_s']:.2f}/s",
                f"{b['throughput_ratio']:.2f}",
            ]
        )
    return rows


def markdown(results: dict[str, Any]) -> str:
    """The GPU section of docs/BENCHMARKS.md."""
    m = results["machine"]
    where = f"{m.get('gpu', 'CPU (--smoke)')}" + (
        f", {m['gpu_memory_gib']} GiB" if m.get("gpu_memory_gib") else ""
    )
    parts = [
        f"`{results['command'].strip()}` on {where}; torch {m['torch']}"
        + (f" (CUDA {m['cuda']})" if m.get("cuda") else "")
        + f", {m['nproc']} CPUs; {results['started_at']}, {results['wall_s']} s."
        + (" **`--smoke` run: shrunk models on a CPU, not a GPU result.**" if results.get("smoke") else ""),
        "Random weights, published configs (`bench/gpu_configs.json`): SD 1.5 (UNet, VAE, CLIP ViT-L/14 text "
        "encoder) and Wan 2.1 T2V 1.3B (transformer and VAE; the UMT5-XXL text encoder cut to 2 layers, "
        "since it runs once per request). One worker (`--slots 1`) serves `gpu-NAME` (batching, up to 4 per "
        "call) and `gpu-NAME-single` (no batching) on the same loaded weights. OmniRT's time includes "
        "exporting the artifact (PNG, or MP4 for Wan), which the direct call does not do.",
    ]
    header = [
        "model",
        "parameters",
        "request",
        "direct p50",
        "OmniRT p50",
        "ratio",
        "export",
        "batching off",
        "batching on",
        "on/off",
    ]
    rows = []
    for name, x in results["models"].items():
        o, b, r = x["overhead"], x["batching"], x["request"]
        params = ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in x["parameters"].items())
        frames = f" x {r['num_frames']} frames" if "num_frames" in r else ""
        rows.append(
            [
                name,
                params,
                f"{r['width']}x{r['height']}{frames}, {r['num_inference_steps']} steps, {x['dtype']}",
                sc.fmt_ms(o["direct_p50_ms"]),
                sc.fmt_ms(o["omnirt_p50_ms"]),
                f"**{o['ratio']:.3f}**",
                sc.fmt_ms(o["export_ms"]),
                f"{b['off']['per_s']:.2f}/s, p50 {sc.fmt_ms(b['off']['p50_ms'])}",
                f"{b['on']['per_s']:.2f}/s, p50 {sc.fmt_ms(b['on']['p50_ms'])}, "
                f"mean batch {b['on']['mean_batch_size']}",
                f"**{b['throughput_ratio']:.2f}**",
            ]
        )
    parts.append(sc.md_table(header, rows, right=3))
    parts.append(
        "Overhead: medians of alternating direct / OmniRT calls at concurrency 1; batching: "
        "calls at the stated concurrency through each entry, after warm-up calls."
    )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    import torch

    if not args.smoke and not torch.cuda.is_available():
        print(
            "bench.gpu: no CUDA GPU on this machine (torch.cuda.is_available() is False); nothing to "
            "measure. Run it on a machine with an NVIDIA GPU and a CUDA build of torch "
            "(or `--smoke` to check the script on the CPU)."
        )
        return 0
    results = run(args, argv)
    print(sc.text_table(["model", "case", "OmniRT", "compared with", "ratio"], summary_rows(results)))
    json_path = args.json or (None if args.smoke else RESULTS / "gpu.json")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(results, indent=1) + "\n")
        print(f"results: {json_path}")
        suite = RESULTS / "suite.json"
        if not args.no_docs and not args.smoke and suite.exists():
            from . import report

            docs = _machine.ROOT / "docs" / "BENCHMARKS.md"
            docs.write_text(report.render(json.loads(suite.read_text()), results))
            print(f"docs: {docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
