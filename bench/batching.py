"""Batching: tiny-sd at concurrency 1, 4 and 8 with the controller's batching off and on.

Two deployments run side by side for the whole scenario, each one controller and one
`omnirt-worker --models tiny-sd --slots 1` (one pipeline call at a time): `off` with
`--max-batch-size 1`, `on` with the default 8 (no batch window, and the busy window never
applies to a 1-slot worker: a call takes the compatible jobs already queued). For each point
(size, concurrency), off then on: untimed warm-up calls, then `calls` calls of
`AsyncClient.generate` (a closed loop, distinct seeds). Throughput, p50 and the mean batch
size from the RunReports. Besides 64x64 (the model's size), one point at a larger size, where
the model's compute outweighs the per-call costs; and, in-process without OmniRT, how the
pipeline's own time grows with the batch at both sizes, which is what decides whether
batching can pay on a CPU.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import omnirt

from . import _scenario as sc
from ._load import drive
from ._stacks import tiny_sd_stacks

NAME = "batching"
TITLE = "Batching: tiny-sd at concurrency 1, 4, 8 with batching off and on"
PROMPT = "a red fox in the snow"
# Batching pays where it gives at least this much more throughput than one call per job.
PAYS = 1.05
MAX_BATCH = 8  # the controller's default --max-batch-size


@dataclass(frozen=True)
class Settings:
    """Counts of the batching scenario; the defaults are the full run."""

    concurrencies: tuple[int, ...] = (1, 4, 8)
    calls: int = 160  # timed calls per (concurrency, mode) at `size`
    size: int = 64
    steps: int = 4
    large_size: int = 256  # one more point at this size and `large_concurrency` (0 = none)
    large_concurrency: int = 4
    large_calls: int = 32
    scaling_repeats: int = 3  # in-process calls per batch size for the scaling measurement

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), calls=16, large_calls=8, scaling_repeats=1)


async def measure(
    address: str, concurrency: int, calls: int, request: dict[str, Any], warmup: int = 0
) -> dict[str, Any]:
    """`warmup` untimed calls (default 2 x concurrency), then `calls` timed ones of `request`.

    Seeds are the call index; `concurrency` calls are in flight.

    Returns the load summary plus the batch sizes the RunReports give.
    """
    sizes: Counter[int] = Counter()
    async with omnirt.AsyncClient(address) as client:

        async def call(i: int) -> None:
            result = await client.generate(**request, seed=i, timeout=600)
            sizes[max(1, result.report.batch_size)] += 1

        await drive(call, warmup or 2 * concurrency, concurrency, 600)
        sizes.clear()
        result = await drive(call, calls, concurrency, 600)
    summary = result.summary()
    jobs = sum(sizes.values())
    summary["batch_sizes"] = dict(sorted(sizes.items()))
    summary["mean_batch_size"] = round(sum(k * v for k, v in sizes.items()) / jobs, 2) if jobs else 0.0
    summary["batched_share"] = round(sum(v for k, v in sizes.items() if k > 1) / jobs, 3) if jobs else 0.0
    return summary


def _points(settings: Settings) -> list[tuple[int, int, int]]:
    points = [(settings.size, c, settings.calls) for c in settings.concurrencies]
    if settings.large_size:
        points.append((settings.large_size, settings.large_concurrency, settings.large_calls))
    return points


def compute_scaling(ctx: sc.Context, settings: Settings) -> list[dict[str, Any]]:
    """In-process, no OmniRT: the pipeline's time for 1 image and for a batch of `MAX_BATCH` images."""
    import time

    import torch

    from .overhead import load_direct

    pipeline = load_direct(ctx)
    out = []
    for size in sorted({settings.size, settings.large_size} - {0}):

        def call(batch: int, size: int = size) -> float:
            generators = [torch.Generator("cpu").manual_seed(i) for i in range(batch)]
            t0 = time.perf_counter()
            pipeline(
                prompt=[PROMPT] * batch,
                width=size,
                height=size,
                num_inference_steps=settings.steps,
                generator=generators,
            )
            return time.perf_counter() - t0

        call(1)  # warm-up
        one = sc.median([call(1) for _ in range(settings.scaling_repeats)])
        many = sc.median([call(MAX_BATCH) for _ in range(settings.scaling_repeats)])
        out.append(
            {
                "size": size,
                "one_ms": sc.ms(one),
                "batch_ms": sc.ms(many),
                "batch": MAX_BATCH,
                "per_image_ratio": sc.ratio(many, MAX_BATCH * one),
            }
        )
    return out


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    scaling = compute_scaling(ctx, settings)
    stacks = tiny_sd_stacks(ctx)
    points = []
    try:
        for size, c, calls in _points(settings):
            request = {
                "model": "tiny-sd",
                "prompt": PROMPT,
                "width": size,
                "height": size,
                "num_inference_steps": settings.steps,
            }
            point: dict[str, Any] = {"size": size, "concurrency": c, "calls": calls}
            for mode in ("off", "on"):
                point[mode] = asyncio.run(measure(stacks[mode].address, c, calls, request))
            point["throughput_ratio"] = sc.ratio(point["on"]["per_s"], point["off"]["per_s"])
            point["p50_ratio"] = sc.ratio(point["on"]["p50_ms"], point["off"]["p50_ms"])
            points.append(point)
    finally:
        for stack in stacks.values():
            stack.stop()
    rows = []
    for p in points:
        on, off = p["on"], p["off"]
        rows.append(
            sc.Row(
                NAME,
                f"tiny-sd {p['size']}x{p['size']} c{p['concurrency']}: calls/s (p50), batching on vs off",
                f"on {sc.fmt_rate(on['per_s'])} ({sc.fmt_ms(on['p50_ms'])}), "
                f"mean batch {on['mean_batch_size']}",
                f"off {sc.fmt_rate(off['per_s'])} ({sc.fmt_ms(off['p50_ms'])})",
                p["throughput_ratio"],
                "",
                pays(p),
            ).as_dict()
        )
    return {"settings": sc.settings_dict(settings), "scaling": scaling, "points": points, "rows": rows}


def pays(point: dict[str, Any]) -> str:
    """`pays` / `does not pay` for one point (throughput on over off, against PAYS).

    Where no call held more than one job, batching cannot have changed anything: "does not pay"
    whatever the (noise) ratio says.
    """
    ratio = point.get("throughput_ratio")
    batched = point["on"]["mean_batch_size"] > 1.0
    return "pays" if batched and ratio is not None and ratio >= PAYS else "does not pay"


def _why(point: dict[str, Any], scaling: dict[int, dict[str, Any]]) -> str:
    """One sentence on a point's verdict."""
    size, c, ratio = point["size"], point["concurrency"], point["throughput_ratio"]
    label = f"{size}x{size} at concurrency {c} (x{ratio:.2f})"
    if point["on"]["mean_batch_size"] <= 1.0:
        return (
            f"At {label} it cannot pay: no call held more than one job (a lone caller never leaves a "
            "second job in the queue), so on and off ran the same calls and the difference is noise."
        )
    scale = scaling.get(point["size"])
    model_saves = (
        scale is not None and scale["per_image_ratio"] is not None and scale["per_image_ratio"] < 0.95
    )
    cost = (
        f" (in-process a batch of {scale['batch']} costs {scale['per_image_ratio']:.2f}x the time per image "
        "of a lone call)"
        if scale
        else ""
    )
    if pays(point) == "pays" and model_saves:
        return (
            f"At {label} it pays: one call for several jobs shares the model's per-call costs: Python "
            f"dispatch of every layer, the scheduler, small kernels that leave the core idle{cost}."
        )
    if pays(point) == "pays":
        return (
            f"At {label} it pays, but not through the model, whose time per image does not shrink in a "
            f"batch{cost}: fewer calls mean less of OmniRT's per-job work (assignments, events, results) "
            "and of the client's, which on these shared cores competes with the model's compute."
        )
    if model_saves:
        return (
            f"At {label} it does not pay although the model itself would save time in a batch{cost}: "
            f"the batches were small (mean {point['on']['mean_batch_size']}) and each job waits for its "
            "whole batch."
        )
    return (
        f"At {label} it does not pay: on a CPU the model's compute grows about linearly with the batch "
        f"(no idle parallel units to fill, unlike a GPU){cost}, so there is little to share, and each "
        "job waits for its whole batch."
    )


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    header = [
        "size",
        "concurrency",
        "off: calls/s",
        "off: p50",
        "on: calls/s",
        "on: p50",
        "on: mean batch",
        "on: share batched",
        "throughput on/off",
        "p50 on/off",
        "verdict",
    ]
    rows = [
        [
            f"{p['size']}x{p['size']}",
            p["concurrency"],
            f"{p['off']['per_s']:.1f}",
            sc.fmt_ms(p["off"]["p50_ms"]),
            f"{p['on']['per_s']:.1f}",
            sc.fmt_ms(p["on"]["p50_ms"]),
            p["on"]["mean_batch_size"],
            f"{p['on']['batched_share']:.0%}",
            f"**{p['throughput_ratio']:.2f}**",
            f"{p['p50_ratio']:.2f}",
            pays(p),
        ]
        for p in result["points"]
    ]
    scaling = {x["size"]: x for x in result.get("scaling", [])}
    scaling_rows = [
        [
            f"{x['size']}x{x['size']}",
            sc.fmt_ms(x["one_ms"]),
            sc.fmt_ms(x["batch_ms"]),
            f"**{x['per_image_ratio']:.2f}**",
        ]
        for x in result.get("scaling", [])
    ]
    return "\n\n".join(
        [
            "Two deployments side by side, each one controller and one `omnirt-worker --models tiny-sd "
            "--slots 1`: **off** `omnirt-controller --max-batch-size 1`, **on** the default (up to 8 jobs "
            f"per call, no batch window). {s['steps']} steps; per point and mode {s['calls']} timed "
            f"`AsyncClient.generate` calls ({s['large_calls']} at {s['large_size']}x{s['large_size']}, "
            "distinct "
            "seeds) after untimed warm-up calls, off then on.",
            sc.md_table(header, rows),
            "\n".join(f"- {_why(p, scaling)}" for p in result["points"]),
            f"The pipeline alone (in-process, no OmniRT, {s['steps']} steps, "
            f"median of {s['scaling_repeats']}): "
            f"one image against one call of {MAX_BATCH} images.",
            sc.md_table(
                ["size", "1 image", f"{MAX_BATCH} images in one call", "time per image, batched / alone"],
                scaling_rows,
            ),
            "Below 1 in the last column, batching saves work; near 1 it cannot pay on this CPU whatever the "
            "serving system does. A batch also makes each request wait for its whole batch (p50 on/off). "
            "**mean batch** / **share batched** come from each result's `RunReport.batch_size`.",
        ]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown)
