"""The GPU variant: SD 1.5, SDXL, FLUX.1-dev and Wan 2.1 1.3B at their published sizes, direct vs OmniRT.

    python -m bench.gpu                 # on a CUDA machine (meant for ~10 min on one H100/H200; untimed)
    python -m bench.gpu --only flux,wan # some of the models: sd15, sdxl, flux, wan
    python -m bench.gpu --smoke         # the same code on the CPU with shrunk models (a check)

On a machine without CUDA it says so and exits 0. Otherwise it builds the pipelines with random
weights from their published configs (bench/gpu_configs.json; no hub; the T5-XXL and UMT5-XXL
text encoders of Flux and Wan cut to 2 layers, see below), saves them, and starts one
controller and one `omnirt-worker --backend cuda --slots 1` serving them (its model cache
holds one model at a time, so GPU memory holds at most one model per process). Per model:

- overhead: the same request (SD 1.5 512x512; SDXL and Flux 1024x1024; Wan 832x480 with 17
  frames; 20 steps; fixed seed) called directly in this process (loaded the way the worker loads
  it) and through `Client.generate`, alternating, `--calls` times each after one warm-up each;
  medians, ratio;
- batching: `--batch-calls` calls at concurrency `--concurrency` through `gpu-NAME-single`
  (supports_batching = false) and `gpu-NAME` (batching, up to 4 per call), the same weights;
- step cache (the transformer models, Flux and Wan): `--cache-rounds` pairs of calls through
  OmniRT with and without `extra.runtime.step_cache` (first_block at the JSON's threshold, 0.5
  and 0.25: a random first block's residual changes more between steps than a trained one's,
  see `step_cache_note`), order swapped every round: speed-up of the medians, PSNR of the
  cached output against the uncached one (and, for scale, of another seed's), attention
  computations the cache skipped;
- continuous (SDXL only, ~4 min): `bench.continuous`'s open loop at 1024x1024, whole-request
  batching against step-level scheduling (issue 30), each deployment a controller and a one-slot
  worker of its own; seeded Poisson arrivals at 80 % and 130 % of whole's capacity, 40 requests
  per point, steps from {4, 8, 20}, a tenth urgent;
- CFG parallel, only with 2 or more CUDA devices (else "skipped: 1 device"): a second worker
  in `persistent_worker` mode serves `gpu-NAME-cfg2`, a resident 2-rank group with
  `runtime.parallel = "cfg"` (the two halves of classifier-free guidance on two GPUs), and the
  same request with a negative prompt (Flux: `extra.true_cfg_scale`, true CFG) alternates
  between it and the one-process `gpu-NAME-single`, `--calls` times each after one warm-up
  each: speed-up, PSNR between the two outputs, the split each rank reports. `--smoke` runs it
  for flux on the CPU with two gloo ranks, so the code path is exercised.

The text encoders of Flux and Wan are the only reduction: the denoisers, what the benchmark
measures, are the real ones. T5-XXL (4.7B parameters) and UMT5-XXL (5.7B) run once per request
(well under 1 % of a call's work), but each copy (the direct pipeline's, the worker's, a CFG
rank's) would add 9.5-11 GB of GPU memory next to FLUX.1-dev's 24 GB transformer, and time to
every save and load. They keep their width (4096) and sequence length (512 tokens); the run
prints the note, and the JSON and the docs section carry it.

`--cfg-models` picks the models of the CFG-parallel case (`none`: none). Disk: the saved
models take about 40 GB (`--model-dir` to choose where).

Results go to bench/results/gpu.json and, when bench/results/suite.json exists, into
docs/BENCHMARKS.md (its GPU section), the way the suite records its own.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import omnirt

from . import _gpu_models as models
from . import _machine
from . import _scenario as sc
from ._daemons import Controller, Worker
from ._gpu_report import summary_rows
from ._stacks import wait_connected
from .batching import measure
from .step_cache import psnr

RESULTS = _machine.ROOT / "bench" / "results"
PROMPT = "a sailing boat on a calm sea at sunrise"
SEED = 7
# Meant for ~10 minutes on one H100-class GPU (estimated from the models' FLOPs, not yet timed):
# a 1024x1024 FLUX.1-dev call of 20 steps takes several seconds there.
DEFAULT_CALLS = {"sd15": 5, "sdxl": 3, "flux": 2, "wan": 2}
DEFAULT_BATCH_CALLS = {"sd15": 8, "sdxl": 4, "flux": 4, "wan": 4}
DEFAULT_CACHE_ROUNDS = 2
# On a CPU each 2-rank group start (torchrun, two ranks importing torch and diffusers) takes
# about 12 s on 2 cores: `--smoke` runs the CFG-parallel case on one model, the one whose
# request adds the most (a negative prompt and `extra.true_cfg_scale`, two denoiser calls a step).
SMOKE_CFG_MODELS = ("flux",)
TIMEOUT_S = 1800
# The continuous case (issue 30): the `continuous` scenario's open loop on this model at its full
# size, whole-request batching against step-level scheduling, after the other cases (~4 min).
CONTINUOUS_MODEL = "sdxl"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--only", default=",".join(models.MODELS), help=f"models: {', '.join(models.MODELS)} (default all)"
    )
    parser.add_argument(
        "--calls", type=int, default=0, help="timed calls per side (default: sd15 5, sdxl 3, flux 2, wan 2)"
    )
    parser.add_argument(
        "--batch-calls", type=int, default=0, help="calls per batching mode (sd15 8, the others 4)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="concurrency of the batching runs")
    parser.add_argument(
        "--cache-rounds",
        type=int,
        default=DEFAULT_CACHE_ROUNDS,
        help=f"cached/uncached pairs of the step cache case, at least 1 (flux, wan; {DEFAULT_CACHE_ROUNDS})",
    )
    parser.add_argument(
        "--cfg-models",
        help="models of the CFG-parallel case, or 'none' (default: every model; --smoke: "
        f"{','.join(SMOKE_CFG_MODELS)})",
    )
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch CPU threads here and in the worker (4; --smoke 1)"
    )
    parser.add_argument("--smoke", action="store_true", help="run on the CPU with shrunk models (a check)")
    parser.add_argument("--model-dir", type=Path, help="where to build the models (default: a temporary one)")
    parser.add_argument(
        "--json", type=Path, help="results file (default bench/results/gpu.json; --smoke: none)"
    )
    parser.add_argument("--no-docs", action="store_true", help="do not regenerate docs/BENCHMARKS.md")
    args = parser.parse_args(argv)
    if args.cache_rounds < 1:
        parser.error("--cache-rounds must be at least 1")
    args.names = [n.strip() for n in args.only.split(",") if n.strip()]
    default_cfg = ",".join(SMOKE_CFG_MODELS if args.smoke else models.MODELS)
    cfg = args.cfg_models if args.cfg_models is not None else default_cfg
    args.cfg_names = [] if cfg.strip() == "none" else [n.strip() for n in cfg.split(",") if n.strip()]
    unknown = sorted((set(args.names) | set(args.cfg_names)) - set(models.MODELS))
    if unknown or not args.names:
        parser.error(
            f"unknown model(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(models.MODELS)}"
        )
    return args


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


def decoded(result: omnirt.GenerateResult) -> Any:
    """The first artifact's pixels as floats in [0, 1]: a PNG's, or an MP4's frames stacked."""
    import numpy as np

    artifact = result.artifacts[0]
    if artifact.mime_type.startswith("video/"):
        import av

        with av.open(io.BytesIO(artifact.data), mode="r") as container:
            frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
        return frames.astype(np.float32) / 255.0
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(artifact.data)).convert("RGB"), dtype=np.float32) / 255.0


def _db(value: float) -> float | None:
    """A PSNR for JSON, which has no inf: None stands for identical outputs."""
    return None if value == float("inf") else round(value, 2)


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
        return client.generate(model=model, prompt=PROMPT, seed=SEED, timeout=TIMEOUT_S)

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


def _batching(name: str, address: str, args: argparse.Namespace) -> dict[str, Any]:
    calls = args.batch_calls or DEFAULT_BATCH_CALLS[name]
    out: dict[str, Any] = {"concurrency": args.concurrency, "calls": calls}
    # Warm-up: the model is warm from the overhead case; one call without batching, one full
    # batch with it (its batch shapes), since a Flux or Wan call takes seconds.
    for mode, model, warmup in (("off", f"gpu-{name}-single", 1), ("on", f"gpu-{name}", args.concurrency)):
        request = {"model": model, "prompt": PROMPT}
        out[mode] = asyncio.run(measure(address, args.concurrency, calls, request, warmup))
    out["throughput_ratio"] = sc.ratio(out["on"]["per_s"], out["off"]["per_s"])
    return out


def _timed(client: omnirt.Client, **fields: Any) -> tuple[float, omnirt.GenerateResult]:
    t0 = time.perf_counter()
    result = client.generate(prompt=PROMPT, timeout=TIMEOUT_S, **fields)
    return time.perf_counter() - t0, result


def _step_cache(client: omnirt.Client, name: str, table: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Uncached and cached calls through `gpu-NAME-single`, alternating, the same seed."""
    model = f"gpu-{name}-single"
    cached_extra = {"runtime": {"step_cache": table}}
    sides: dict[bool, list[float]] = {False: [], True: []}
    outputs: dict[bool, omnirt.GenerateResult] = {}
    for cached in (False, True):  # one warm-up call of each
        _timed(client, model=model, seed=SEED, extra=cached_extra if cached else None)
    for i in range(rounds):
        for cached in (i % 2 == 1, i % 2 == 0):
            seconds, outputs[cached] = _timed(
                client, model=model, seed=SEED, extra=cached_extra if cached else None
            )
            sides[cached].append(seconds)
    _, other = _timed(client, model=model, seed=SEED + 1)
    uncached = decoded(outputs[False])
    report = outputs[True].report
    u50, c50 = sc.median(sides[False]), sc.median(sides[True])
    return {
        "table": table,
        "model": model,
        "rounds": rounds,
        "uncached_p50_ms": sc.ms(u50),
        "cached_p50_ms": sc.ms(c50),
        "speedup": sc.ratio(u50, c50),
        "psnr_db": _db(psnr(decoded(outputs[True]), uncached)),
        "other_seed_psnr_db": _db(psnr(decoded(other), uncached)),
        "attention_skipped": report.cache_hits.get("step_cache", 0),
        "applied": report.config_resolved.get("runtime_options", {}).get("step_cache"),
    }


def cfg_parallel_devices(device: str) -> int:
    """How many devices a 2-rank group could use here: the CUDA count, or 2 on the CPU (gloo)."""
    import torch

    return torch.cuda.device_count() if device.startswith("cuda") else 2


def _cfg_parallel(
    name: str,
    spec: dict[str, Any],
    controller: Controller,
    model_dir: Path,
    log_dir: Path,
    args: argparse.Namespace,
    device: str,
) -> dict[str, Any]:
    """The same guided request through `gpu-NAME-single` (one process, one device) and
    `gpu-NAME-cfg2` (2 ranks, guidance split), alternating, on a worker started for it alone."""
    devices = cfg_parallel_devices(device)
    if devices < 2:
        return {"status": "skipped", "reason": f"{devices} device"}
    if name not in args.cfg_names:
        return {"status": "skipped", "reason": f"not in --cfg-models ({','.join(args.cfg_names) or 'none'})"}
    calls = args.calls or DEFAULT_CALLS[name]
    fields = {"seed": SEED, **spec["cfg_parallel"]}
    worker = Worker(
        log_dir,
        controller.address,
        f"gpu-cfg-{name}",
        model_dir,
        "--torch-threads",
        str(args.torch_threads),
        "--mode",
        "persistent_worker",
        "--backend",
        device,
        "--slots",
        "1",
        "--models",
        f"gpu-{name}-cfg2",
    )
    sides: dict[str, list[float]] = {"single": [], "cfg2": []}
    outputs: dict[str, omnirt.GenerateResult] = {}
    try:
        worker.start()
        wait_connected(controller, [worker], timeout=600)
        with omnirt.Client(controller.address) as client:
            t0 = time.perf_counter()
            _timed(client, model=f"gpu-{name}-cfg2", **fields)  # waits for the group's start
            start_ms = sc.ms(time.perf_counter() - t0)
            _timed(client, model=f"gpu-{name}-single", **fields)
            for _ in range(calls):
                for side in ("single", "cfg2"):
                    seconds, outputs[side] = _timed(client, model=f"gpu-{name}-{side}", **fields)
                    sides[side].append(seconds)
    except Exception:
        print(f"--- {worker.name}\n{worker.log_tail(3000)}", file=sys.stderr)
        raise
    finally:
        worker.stop()
    s50, p50 = sc.median(sides["single"]), sc.median(sides["cfg2"])
    config = outputs["cfg2"].report.config_resolved
    return {
        "status": "ok",
        "calls": calls,
        "request": fields,
        "first_call_ms": start_ms,
        "one_process_p50_ms": sc.ms(s50),
        "two_ranks_p50_ms": sc.ms(p50),
        "speedup": sc.ratio(s50, p50),
        "psnr_vs_one_process_db": _db(psnr(decoded(outputs["cfg2"]), decoded(outputs["single"]))),
        "guidance_split": config.get("guidance_split", []),
        "parallel": config.get("parallel", ""),
    }


def _case(name: str, label: str, measure_case: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one case, print how long it took, and record that as its `wall_s`."""
    t0 = time.perf_counter()
    out = measure_case()
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    status = f"{out['status']}: {out['reason']}" if out.get("status") == "skipped" else f"{out['wall_s']} s"
    print(f"  {name} {label}: {status}", flush=True)
    return out


def run_model(
    name: str,
    spec: dict[str, Any],
    controller: Controller,
    model_dir: Path,
    log_dir: Path,
    args: argparse.Namespace,
    device: str,
) -> dict[str, Any]:
    calls = args.calls or DEFAULT_CALLS[name]
    address = controller.address

    def overhead() -> dict[str, Any]:
        pipeline = models.load(spec, model_dir / f"gpu-{name}", device)
        try:
            with omnirt.Client(address) as client:
                return _overhead(pipeline, client, f"gpu-{name}", spec["request"], calls)
        finally:
            del pipeline
            if device.startswith("cuda"):
                import torch

                torch.cuda.empty_cache()

    def step_cache() -> dict[str, Any]:
        with omnirt.Client(address) as client:
            return _step_cache(client, name, spec["step_cache"], args.cache_rounds)

    out: dict[str, Any] = {
        "request": spec["request"],
        "dtype": spec["dtype"],
        "overhead": _case(name, "overhead", overhead),
        "batching": _case(name, "batching", lambda: _batching(name, address, args)),
    }
    if "text_encoder_note" in spec:
        out["text_encoder_note"] = spec["text_encoder_note"]
    if "step_cache" in spec:
        out["step_cache"] = {**_case(name, "step cache", step_cache), "note": spec.get("step_cache_note", "")}
    out["cfg_parallel"] = _case(
        name, "CFG parallel", lambda: _cfg_parallel(name, spec, controller, model_dir, log_dir, args, device)
    )
    return out


def _continuous(
    spec: dict[str, Any], catalog: Path, model_dir: Path, log_dir: Path, args: argparse.Namespace, device: str
) -> dict[str, Any]:
    """The open loop of `bench.continuous` on `CONTINUOUS_MODEL` at the request's size: two loads,
    whole-request batching and step-level, 40 requests per point (8 with --smoke)."""
    from . import continuous

    small = args.smoke
    settings = continuous.Settings(
        cases=((f"gpu-{CONTINUOUS_MODEL}", int(spec["request"]["width"])),),
        loads=(0.8, 1.3),
        jobs=8 if small else 40,
        large_jobs=8 if small else 40,
        steps=(2, 4) if small else (4, 8, 20),
        capacity_jobs=8 if small else 16,
        capacity_concurrency=4,
        max_point_s=60.0,
    )
    ctx = sc.Context(log_dir=log_dir, model_dir=model_dir, torch_threads=args.torch_threads)
    result = continuous.run(
        settings, ctx, ("whole", "step"), ("--catalog", str(catalog)), ("--backend", device)
    )
    return {"status": "ok", **result}


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Build the models, start the daemons, measure every model; the results as JSON-able data."""
    import torch

    device = "cpu" if args.smoke else "cuda"
    args.torch_threads = args.torch_threads or (1 if args.smoke else 4)
    torch.set_num_threads(args.torch_threads)  # the same as the worker's --torch-threads
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
        for name in args.names:
            path = model_dir / f"gpu-{name}"
            t0 = time.perf_counter()
            params = models.build(name, configs[name], path, device)
            built[name] = {"build_s": round(time.perf_counter() - t0, 1), "parameters": params}
            entries += models.catalog_entries(name, configs[name], path)
            counts = ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in params.items())
            print(f"built {name}: {counts} in {built[name]['build_s']} s", flush=True)
            if "text_encoder_note" in configs[name]:
                print(f"  note: {configs[name]['text_encoder_note']}", flush=True)
        catalog = log_dir / "gpu-catalog.json"
        catalog.write_text(json.dumps({"models": entries}))
        # Room for the largest model (with a margin for the modules Wan keeps in float32): a
        # model's first call evicts the one measured before, so the worker holds at most one.
        budget = int(1.2 * max(models.weight_bytes(model_dir / f"gpu-{n}") for n in args.names))
        results["worker_model_cache_bytes"] = budget
        controller = Controller(log_dir, "--catalog", str(catalog)).start()
        served = ",".join(e["id"] for e in entries if e["execution_mode"] == "legacy_call")
        worker = Worker(
            log_dir,
            controller.address,
            "gpu-w0",
            model_dir,
            "--torch-threads",
            str(args.torch_threads),
            "--backend",
            device,
            "--slots",
            "1",
            "--no-step-engine",  # the batching case is whole-request batching against none
            "--model-cache-bytes",
            str(budget),
            "--models",
            served,
        )
        try:
            worker.start()
            wait_connected(controller, [worker], timeout=600)
            for name in args.names:
                print(f"measuring {name}", flush=True)
                results["models"][name] = {
                    **built[name],
                    **run_model(name, configs[name], controller, model_dir, log_dir, args, device),
                }
        except Exception:
            for daemon in (worker, controller):
                print(f"--- {daemon.name}\n{daemon.log_tail(3000)}", file=sys.stderr)
            raise
        finally:
            worker.stop()
            controller.stop()
        if CONTINUOUS_MODEL in args.names:  # its deployments of its own, the others stopped
            spec = configs[CONTINUOUS_MODEL]
            results["continuous"] = _case(
                CONTINUOUS_MODEL,
                "continuous",
                lambda: _continuous(spec, catalog, model_dir, log_dir, args, device),
            )
    results["wall_s"] = round(time.perf_counter() - started, 1)
    return results


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
