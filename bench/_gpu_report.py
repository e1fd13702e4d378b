"""What `bench.gpu` prints and writes: its summary table and the GPU section of docs/BENCHMARKS.md."""

from __future__ import annotations

from typing import Any

from . import _scenario as sc
from . import continuous
from .step_cache import fmt_db


def _request_text(r: dict[str, Any]) -> str:
    frames = f" x {r['num_frames']} frames" if "num_frames" in r else ""
    return f"{r['width']}x{r['height']}{frames}, {r['num_inference_steps']} steps"


def _cache_text(table: dict[str, Any]) -> str:
    return " ".join([table["kind"], *(f"{k} {v}" for k, v in table.items() if k != "kind")])


def summary_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = []
    for name, m in results["models"].items():
        o, b = m["overhead"], m["batching"]
        rows.append(
            [
                name,
                f"{_request_text(m['request'])}, c1: p50",
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
        if "step_cache" in m:
            s = m["step_cache"]
            rows.append(
                [
                    name,
                    f"step cache {_cache_text(s['table'])}: p50 (speed-up)",
                    sc.fmt_ms(s["cached_p50_ms"]),
                    f"uncached {sc.fmt_ms(s['uncached_p50_ms'])}, PSNR {fmt_db(s['psnr_db'])}, "
                    f"{s['attention_skipped']} attention skipped",
                    f"{s['speedup']:.2f}",
                ]
            )
        c = m["cfg_parallel"]
        if c["status"] == "ok":
            rows.append(
                [
                    name,
                    "CFG on 2 ranks vs 1 process: p50 (speed-up)",
                    sc.fmt_ms(c["two_ranks_p50_ms"]),
                    f"1 process {sc.fmt_ms(c['one_process_p50_ms'])}, "
                    f"PSNR {fmt_db(c['psnr_vs_one_process_db'])}",
                    f"{c['speedup']:.2f}",
                ]
            )
        else:
            rows.append([name, "CFG on 2 ranks", f"{c['status']}: {c['reason']}", "", ""])
    steps = results.get("continuous")
    if steps and steps.get("cases"):
        for r in continuous.rows(steps["cases"]):
            ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
            model = r["case"].split(" ", 1)[0].removeprefix("gpu-")
            rows.append([model, r["case"].split(", ", 1)[1], r["omnirt"], r["reference"], ratio])
    elif steps:
        rows.append(["sdxl", "continuous", f"{steps.get('status')}: {steps.get('reason', '')}", "", ""])
    return rows


def _params(x: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v / 1e6:,.1f}M" for k, v in x["parameters"].items())


def _split(c: dict[str, Any]) -> str:
    """Each rank's guidance split: its pattern and the denoiser calls it computed of those it saw."""
    # Struct numbers come back as floats.
    return "; ".join(
        f"rank {i}: {s['pattern']}, {int(s['computed_calls'])}/{int(s['denoiser_calls'])} calls"
        for i, s in enumerate(c.get("guidance_split", []))
    )


def markdown(results: dict[str, Any]) -> str:
    """The GPU section of docs/BENCHMARKS.md."""
    m = results["machine"]
    where = f"{m.get('gpu', 'CPU (--smoke)')}" + (
        f", {m['gpu_memory_gib']} GiB" if m.get("gpu_memory_gib") else ""
    )
    gpus = f" x {m['gpus']}" if m.get("gpus", 1) > 1 else ""
    parts = [
        f"`{results['command'].strip()}` on {where}{gpus}; torch {m['torch']}"
        + (f" (CUDA {m['cuda']})" if m.get("cuda") else "")
        + f", {m['nproc']} CPUs; {results['started_at']}, {results['wall_s']} s."
        + (" **`--smoke` run: shrunk models on a CPU, not a GPU result.**" if results.get("smoke") else ""),
        "Random weights, published configs (`bench/gpu_configs.json`): SD 1.5 (UNet, VAE, CLIP ViT-L/14 text "
        "encoder), SDXL base 1.0 (UNet, VAE, both CLIP text encoders), FLUX.1-dev (transformer, VAE, CLIP-L; "
        "the T5-XXL text encoder cut to 2 of its 24 layers) and Wan 2.1 T2V 1.3B (transformer and VAE; the "
        "UMT5-XXL text encoder cut to 2 layers): the text encoders run once per request, the denoisers are "
        "the real ones. One worker (`--slots 1`) serves `gpu-NAME` (batching, up to 4 per call) and "
        "`gpu-NAME-single` (no batching) on the same loaded weights. OmniRT's time includes exporting the "
        "artifact (PNG, or MP4 for Wan), which the direct call does not do.",
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
        o, b = x["overhead"], x["batching"]
        rows.append(
            [
                name,
                _params(x),
                f"{_request_text(x['request'])}, {x['dtype']}",
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
    cache_rows = [
        [
            name,
            f"`{_cache_text(s['table'])}`",
            sc.fmt_ms(s["uncached_p50_ms"]),
            sc.fmt_ms(s["cached_p50_ms"]),
            f"**{s['speedup']:.2f}**",
            fmt_db(s["psnr_db"]),
            fmt_db(s["other_seed_psnr_db"]),
            str(s["attention_skipped"]),
        ]
        for name, x in results["models"].items()
        if (s := x.get("step_cache"))
    ]
    if cache_rows:
        header = [
            "model",
            "step cache",
            "uncached p50",
            "cached p50",
            "speed-up",
            "PSNR",
            "other seed",
            "skipped",
        ]
        parts.append(
            "Step cache through OmniRT (`extra.runtime.step_cache`, `gpu-NAME-single`): cached and uncached "
            "calls alternate with the same seed. PSNR of the cached output against the uncached one; "
            '"other seed" is another seed\'s uncached output against it, for scale (the weights are '
            "random); skipped: attention computations the cache skipped (`cache_hits`). The thresholds "
            "come from a CPU probe of each config's first block with random weights (`step_cache_note` "
            "in `bench/gpu_configs.json`): a trained model wants its own."
        )
        parts.append(sc.md_table(header, cache_rows, right=2))
    cfg_rows = []
    for name, x in results["models"].items():
        c = x["cfg_parallel"]
        if c["status"] != "ok":
            cfg_rows.append([name, f"{c['status']}: {c['reason']}", "", "", "", "", ""])
            continue
        cfg_rows.append(
            [
                name,
                ", ".join(
                    ["negative prompt", *(f"{k} {v}" for k, v in c["request"].get("extra", {}).items())]
                ),
                sc.fmt_ms(c["one_process_p50_ms"]),
                sc.fmt_ms(c["two_ranks_p50_ms"]),
                f"**{c['speedup']:.2f}**",
                fmt_db(c["psnr_vs_one_process_db"]),
                _split(c),
            ]
        )
    parts.append(
        'CFG parallel (`persistent_worker`, `runtime.parallel = "cfg"`, 2 ranks, one device each) '
        "against the same request in one process (`gpu-NAME-single`), alternating; on CUDA it runs only "
        "with 2 or more devices (`--smoke`: two gloo ranks on the CPU, flux only). PSNR of the 2-rank "
        "output against the one-process one; split: each rank's guidance pattern and the denoiser calls "
        "it computed of those the pipeline made."
    )
    header = ["model", "request adds", "1 process p50", "2 ranks p50", "speed-up", "PSNR", "split per rank"]
    parts.append(sc.md_table(header, cfg_rows, right=2))
    steps = results.get("continuous")
    if steps and steps.get("cases"):
        parts.append(
            "Continuous (issue 30's open loop at full size): seeded Poisson arrivals on SDXL, whole-request "
            "batching against step-level scheduling, each a controller and a one-slot worker of its own "
            "on the device (the `continuous` scenario's code, `bench/continuous.py`)."
        )
        parts.append(continuous.markdown(steps))
    return "\n\n".join(parts)
