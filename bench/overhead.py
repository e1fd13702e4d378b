"""Overhead: the same tiny-sd request called directly with diffusers and through OmniRT.

The direct call loads tiny-sd from the folder the worker builds it into, the way the worker
does (`StableDiffusionPipeline.from_pretrained(path, dtype=float32)`, progress bar off) and
calls it in this process. The OmniRT call is `Client.generate` through the controller to one
`omnirt-worker --models tiny-sd --slots 1` process. Both use the same torch CPU threads
(`torch.set_num_threads` here, `--torch-threads` on the worker), the same prompt, size, steps,
guidance and a fixed seed. After untimed warm-up calls (the worker's first call loads the
model) they alternate, direct then OmniRT, `calls` times each, at concurrency 1; the result is
the ratio of the medians. The first OmniRT image is compared with the direct one pixel by
pixel, so both sides are known to do the same work.

The worker runs pipelines under `torch.inference_mode()` (see `omnirt.worker.runtime.inference_mode`),
where a plain diffusers call runs under the pipeline's own `torch.no_grad()`: the same kernels and
pixels, less autograd bookkeeping per op. So each round also times the direct call under
`torch.inference_mode()` (the two direct calls take turns going first); OmniRT over that one is
the serving overhead alone.

Each round also times a `null`-model job (no compute) and a bare two-hop gRPC echo (the control
plane scenario's relay), once right away and once after sleeping as long as that round's direct
call: gRPC answers processes that have idled (as the controller and the client do while a
model computes) later than busy ones, and these rows show that floor on this machine.

    python -m bench.suite --only overhead
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, replace
from typing import Any

import grpc

import omnirt

from . import _scenario as sc
from ._echo import METHOD
from ._stacks import start_stack
from .control_plane import start_echo

NAME = "overhead"
TITLE = "Overhead: tiny-sd directly in-process vs through SDK -> controller -> worker"
PROMPT = "a lighthouse on a cliff at dusk"
SEED = 42
GUIDANCE = 7.5
TARGET = 1.05
# The echo answers with as many bytes as a null job's GenerateResponse (the control plane scenario
# measures it: 876 B).
ECHO_RESPONSE_BYTES = 876


@dataclass(frozen=True)
class Settings:
    """Counts and sizes of the overhead scenario; the defaults are the full run."""

    calls: int = 30  # timed calls per side (interleaved)
    warmup: int = 3  # untimed calls per side first
    sizes: tuple[int, ...] = (64, 256)  # square sizes; the target applies to the first (64x64)
    steps: int = 4

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), calls=5, warmup=1, sizes=(64,))


def load_direct(ctx: sc.Context) -> Any:
    """tiny-sd as the worker loads it, in this process, with the context's torch threads."""
    import torch
    from diffusers import StableDiffusionPipeline

    from omnirt.worker.tiny import registry as tiny_models

    torch.set_num_threads(ctx.torch_threads)
    path = tiny_models.ensure_builtin("tiny-sd", ctx.model_dir)
    pipeline = StableDiffusionPipeline.from_pretrained(str(path), dtype=torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _pixels(image: Any) -> Any:
    import numpy as np

    return np.asarray(image.convert("RGB"), dtype=np.int16)


def _timed(call: Any) -> float:
    """Seconds one call takes."""
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def _measure_size(
    pipeline: Any, client: omnirt.Client, echo: Any, size: int, settings: Settings
) -> dict[str, Any]:
    import torch
    from PIL import Image

    def direct() -> Any:
        generator = torch.Generator("cpu").manual_seed(SEED)
        return pipeline(
            prompt=PROMPT,
            width=size,
            height=size,
            num_inference_steps=settings.steps,
            guidance_scale=GUIDANCE,
            generator=generator,
        ).images[0]

    def direct_inference_mode() -> Any:
        with torch.inference_mode():
            return direct()

    def through_omnirt() -> omnirt.GenerateResult:
        return client.generate(
            model="tiny-sd",
            prompt=PROMPT,
            width=size,
            height=size,
            num_inference_steps=settings.steps,
            guidance_scale=GUIDANCE,
            seed=SEED,
            timeout=300,
        )

    def null_round_trip() -> None:
        client.generate(model="null", prompt=PROMPT, seed=SEED, timeout=60)

    def echo_round_trip() -> None:
        echo(b"x" * 45, timeout=60)

    for _ in range(settings.warmup):
        direct()
        direct_inference_mode()
        through_omnirt()
        null_round_trip()
        echo_round_trip()
    direct_s: list[float] = []
    direct_im_s: list[float] = []
    omnirt_s: list[float] = []
    null_s: list[float] = []
    null_paused_s: list[float] = []
    echo_s: list[float] = []
    echo_paused_s: list[float] = []
    execution_ms: list[float] = []
    export_ms: list[float] = []
    queue_wait_ms: list[float] = []
    first_image: Any = None
    first_result: omnirt.GenerateResult | None = None
    for i in range(settings.calls):
        # The two direct calls take turns going first: the second of two back-to-back calls finds
        # the caches warm, which would favour whichever always came second.
        if i % 2:
            direct_im_s.append(_timed(direct_inference_mode))
        t0 = time.perf_counter()
        image = direct()
        direct_s.append(time.perf_counter() - t0)
        if not i % 2:
            direct_im_s.append(_timed(direct_inference_mode))
        t0 = time.perf_counter()
        result = through_omnirt()
        omnirt_s.append(time.perf_counter() - t0)
        # Each floor call right away, then after every process idled as long as the model call
        # takes: how a request finds the client, controller and worker after the model's compute.
        for call, right_away, after_pause in (
            (null_round_trip, null_s, null_paused_s),
            (echo_round_trip, echo_s, echo_paused_s),
        ):
            right_away.append(_timed(call))
            time.sleep(direct_s[-1])
            after_pause.append(_timed(call))
        execution_ms.append(result.report.execution_ms)
        export_ms.append(result.report.timing("export") or 0.0)
        queue_wait_ms.append(result.report.queue_wait_ms)
        if first_result is None:
            first_image, first_result = image, result
    assert first_result is not None
    served = Image.open(io.BytesIO(first_result.artifacts[0].data))
    max_diff = int(abs(_pixels(served) - _pixels(first_image)).max())
    d50, o50, i50 = sc.median(direct_s), sc.median(omnirt_s), sc.median(direct_im_s)
    return {
        "size": f"{size}x{size}",
        "steps": settings.steps,
        "calls": settings.calls,
        "direct_p50_ms": sc.ms(d50),
        "omnirt_p50_ms": sc.ms(o50),
        "direct_min_ms": sc.ms(min(direct_s)),
        "omnirt_min_ms": sc.ms(min(omnirt_s)),
        "ratio": sc.ratio(o50, d50),
        # The direct call under torch.inference_mode, as the worker calls the pipeline.
        "direct_inference_mode_p50_ms": sc.ms(i50),
        "ratio_to_inference_mode": sc.ratio(o50, i50),
        "overhead_p50_ms": sc.ms(o50 - d50),
        "paired_overhead_p50_ms": sc.ms(sc.median([o - d for o, d in zip(omnirt_s, direct_s, strict=True)])),
        # Inside the worker: from the assignment's start to its result (load, denoise, decode, export).
        "worker_execution_p50_ms": round(sc.median(execution_ms), 2),
        "worker_export_p50_ms": round(sc.median(export_ms), 2),
        # The same stack's fixed cost per request: a null-model job (no compute, an 8x8 PNG).
        "null_round_trip_p50_ms": sc.ms(sc.median(null_s)),
        # The same after a pause as long as the direct call (gRPC waking idle processes).
        "null_after_pause_p50_ms": sc.ms(sc.median(null_paused_s)),
        # A bare two-hop grpc.aio echo (no OmniRT code), right away and after the same pause.
        "echo_round_trip_p50_ms": sc.ms(sc.median(echo_s)),
        "echo_after_pause_p50_ms": sc.ms(sc.median(echo_paused_s)),
        "queue_wait_p50_ms": round(sc.median(queue_wait_ms), 2),
        "same_pixels_max_diff": max_diff,
        "direct_ms": [sc.ms(s) for s in direct_s],
        "omnirt_ms": [sc.ms(s) for s in omnirt_s],
    }


def wait_answered(echo: Any, timeout_s: float = 60) -> None:
    """Wait until the echo relay (just started) answers a call."""
    started = time.monotonic()
    while True:
        try:
            echo(b"x", timeout=5)
            return
        except grpc.RpcError:
            if time.monotonic() - started > timeout_s:
                raise
            time.sleep(0.1)


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    pipeline = load_direct(ctx)
    stack = start_stack(ctx, "overhead", [["--models", "tiny-sd,null", "--slots", "1"]])
    echo_worker, relay, relay_address = start_echo(ctx.log_dir, ECHO_RESPONSE_BYTES)
    try:
        with omnirt.Client(stack.address) as client, grpc.insecure_channel(relay_address) as channel:
            echo = channel.unary_unary(METHOD)
            wait_answered(echo)
            cases = [_measure_size(pipeline, client, echo, size, settings) for size in settings.sizes]
    finally:
        stack.stop()
        relay.stop()
        echo_worker.stop()
    rows = []
    for i, case in enumerate(cases):
        target = f"<= {TARGET}" if i == 0 else ""
        rows.append(
            sc.Row(
                NAME,
                f"tiny-sd {case['size']}, {case['steps']} steps, c1: p50 latency",
                sc.fmt_ms(case["omnirt_p50_ms"]),
                f"direct {sc.fmt_ms(case['direct_p50_ms'])}",
                case["ratio"],
                target,
                sc.verdict(case["ratio"], "<=", TARGET) if target else "",
            ).as_dict()
        )
        if "ratio_to_inference_mode" in case:
            rows.append(
                sc.Row(
                    NAME,
                    f"tiny-sd {case['size']}, c1: the same vs direct in inference mode",
                    sc.fmt_ms(case["omnirt_p50_ms"]),
                    f"direct {sc.fmt_ms(case['direct_inference_mode_p50_ms'])}",
                    case["ratio_to_inference_mode"],
                ).as_dict()
            )
    return {"settings": sc.settings_dict(settings), "cases": cases, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    header = [
        "size, steps",
        "direct p50",
        "OmniRT p50",
        "ratio",
        "direct in inference mode p50",
        "ratio to it",
        "overhead p50",
        "paired overhead p50",
        "worker execution p50",
        "of it PNG export",
        "null round trip p50",
        "pixels differ by",
    ]
    rows = [
        [
            f"{c['size']}, {c['steps']}",
            sc.fmt_ms(c["direct_p50_ms"]),
            sc.fmt_ms(c["omnirt_p50_ms"]),
            f"**{c['ratio']:.3f}**",
            sc.fmt_ms(c["direct_inference_mode_p50_ms"]) if "direct_inference_mode_p50_ms" in c else "",
            f"{c['ratio_to_inference_mode']:.3f}" if c.get("ratio_to_inference_mode") else "",
            sc.fmt_ms(c["overhead_p50_ms"]),
            sc.fmt_ms(c["paired_overhead_p50_ms"]),
            sc.fmt_ms(c["worker_execution_p50_ms"]),
            sc.fmt_ms(c["worker_export_p50_ms"]),
            sc.fmt_ms(c["null_round_trip_p50_ms"]),
            f"{c['same_pixels_max_diff']}/255",
        ]
        for c in result["cases"]
    ]
    s = result["settings"]
    first = result["cases"][0]
    return "\n\n".join(
        [
            md_intro(s),
            sc.md_table(header, rows),
            _target_line(first),
            "What the numbers mean:\n\n"
            "- **direct / OmniRT p50**: median wall time of one call as its caller sees it; the direct "
            "call is the plain `pipeline(...)` a diffusers user writes (under the pipeline's own "
            "`torch.no_grad()`).\n"
            "- **direct in inference mode**: the same call inside `torch.inference_mode()`, as the worker "
            "runs every pipeline (same kernels and pixels, less autograd bookkeeping per op); **ratio to "
            "it** is OmniRT's serving overhead alone, without the worker's faster call.\n"
            "- **overhead p50**: OmniRT p50 - direct p50; **paired**: the median of (OmniRT call - "
            "the direct call just before it), which cancels slow drifts of the machine.\n"
            "- **worker execution**: the RunReport's `execution_ms`, the assignment's time inside "
            "the worker (denoise, decode, PNG export and sha256 included); the rest of the OmniRT "
            "time is the client, gRPC, the controller (validation, queue, dispatch) and the events.\n"
            "- **of it PNG export**: the `export` stage, encoding the image the direct call returns as "
            "a PIL image (the tiny model's images are noise, which PNG cannot compress: slow for its size).\n"
            "- **null round trip**: a `null`-model job through the same client, controller and worker "
            "in the same rounds, right after the OmniRT call: what a request costs with no compute at "
            "all, the floor of the overhead (and higher after a pause: see the floor table below). "
            "Where it is more than 5% of the direct call, the 1.05 target cannot be met on this "
            "machine by any change to the worker.\n"
            "- **pixels differ by**: the largest per-channel difference between the first OmniRT "
            "image and the direct one (0 = the same image: both sides did the same work)."
            + (
                "\n- The overhead is a roughly constant few milliseconds per request, so the ratio falls "
                "as the model's own compute grows (the larger size)."
                if len(result["cases"]) > 1
                else ""
            ),
            *_floor_table(result["cases"]),
            *_faster_note(result["cases"]),
        ]
    )


def _target_line(first: dict[str, Any]) -> str:
    met = "met" if first["ratio"] is not None and first["ratio"] <= TARGET else "**missed**"
    line = (
        f"Target: ratio <= {TARGET} at {first['size']} ({met}: {first['ratio']:.3f}, "
        f"{sc.fmt_ms(first['overhead_p50_ms'])} added to a {sc.fmt_ms(first['direct_p50_ms'])} call; "
        f"the null round trip alone is {sc.fmt_ms(first['null_round_trip_p50_ms'])}, "
        f"{100 * first['null_round_trip_p50_ms'] / first['direct_p50_ms']:.1f}% of that call"
    )
    if "null_after_pause_p50_ms" not in first:
        return line + ")."
    paused = first["null_after_pause_p50_ms"]
    line += (
        f", and {sc.fmt_ms(paused)} ({100 * paused / first['direct_p50_ms']:.1f}%) after the "
        "processes idled as long as the call takes, as they do while the model computes)."
    )
    if first.get("ratio_to_inference_mode"):
        direct_im, alone = first["direct_inference_mode_p50_ms"], first["ratio_to_inference_mode"]
        line += (
            f" Over the direct call in inference mode ({sc.fmt_ms(direct_im)}), as the worker runs it, "
            f"OmniRT's serving overhead alone is {alone:.3f}."
        )
    return line


def _floor_table(cases: list[dict[str, Any]]) -> list[str]:
    """Round trips without a model, right away and after a pause as long as the direct call."""
    cases = [c for c in cases if "echo_after_pause_p50_ms" in c]
    if not cases:
        return []
    header = [
        "pause (= direct p50)",
        "null job p50",
        "null job after the pause",
        "bare 2-hop gRPC echo p50",
        "echo after the pause",
    ]
    rows = [
        [
            sc.fmt_ms(c["direct_p50_ms"]),
            sc.fmt_ms(c["null_round_trip_p50_ms"]),
            sc.fmt_ms(c["null_after_pause_p50_ms"]),
            sc.fmt_ms(c["echo_round_trip_p50_ms"]),
            sc.fmt_ms(c["echo_after_pause_p50_ms"]),
        ]
        for c in cases
    ]
    return [
        "The floor: round trips with no model, in the same rounds, right away and after sleeping as "
        "long as that round's direct call (so the client, the controller and the worker have idled "
        "as they do while a model computes). The echo is a bare grpc.aio relay with no OmniRT code "
        "(client -> relay -> echo server, as client -> controller -> worker): what it gains after "
        "the pause is gRPC waking idle processes on this machine, which no change to OmniRT removes.",
        sc.md_table(header, rows),
    ]


def _faster_note(cases: list[dict[str, Any]]) -> list[str]:
    """A word on cases where OmniRT came out faster than the direct call (ratio below 1)."""
    faster = [c for c in cases if c["ratio"] is not None and c["ratio"] < 1]
    if not faster:
        return []
    sizes = ", ".join(f"{c['size']} (ratio {c['ratio']:.2f})" for c in faster)
    return [
        f"At {sizes} the call through OmniRT was faster than the direct one although both computed the "
        "same pixels: the worker ran the pipeline faster (its `execution_ms`) than the benchmark process "
        "did, in inference mode (see above) and in a process that does nothing else, where the benchmark "
        "process also built the models, runs the gRPC client and holds more memory. That outweighs "
        "OmniRT's overhead at this size; the ratio to the direct call in inference mode is the overhead "
        "alone."
    ]


def md_intro(settings: dict[str, Any]) -> str:
    sizes = ", ".join(f"{n}x{n}" for n in settings["sizes"])
    return (
        f"The same tiny-sd request ({sizes}; {settings['steps']} steps, guidance {GUIDANCE}, seed "
        f"{SEED}) called directly in the benchmark process with diffusers and through "
        "`Client.generate` -> controller -> one worker (1 slot), alternating, "
        f"{settings['calls']} timed calls each after {settings['warmup']} untimed ones, concurrency 1. "
        "Both sides load the same saved pipeline the same way and use the same number of torch threads. "
        "Each round also makes the direct call inside `torch.inference_mode()`, as the worker does; the "
        "two direct calls take turns going first."
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown)
