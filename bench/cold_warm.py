"""Cold vs warm: the first request a fresh worker serves (model load) against the ones after it.

One controller; for each execution mode in turn one fresh `omnirt-worker --mode MODE --models
MODEL` starts (tiny models already built on disk, as after any first start), serves one
request (cold), then `warm` more of the same (seeds differ), and stops. Numbers from the client
(wall time) and from each RunReport (`cold_start`, the `load` stage, `execution_ms`).
"""

from __future__ import annotations

import io
import time
import wave
from dataclasses import dataclass, replace
from typing import Any

import omnirt

from . import _scenario as sc
from ._daemons import Controller, Worker
from ._stacks import wait_connected

NAME = "cold_warm"
TITLE = "Cold vs warm: the first request of a fresh worker (model load) vs the next, per execution mode"
PROMPT = "a cold start"

# mode -> (model, worker flags)
MODES: dict[str, tuple[str, tuple[str, ...]]] = {
    "legacy_call": ("tiny-sd", ()),
    "modular": ("tiny-sd-modular", ("--mode", "modular")),
    "subprocess": ("talking-head-demo", ("--mode", "subprocess")),
    # --no-preload: by default the group starts with the worker, so the first request would be
    # warm; here the point is what a cold start costs.
    "persistent_worker": ("tiny-sd-cfg2", ("--mode", "persistent_worker", "--no-preload")),
}


@dataclass(frozen=True)
class Settings:
    """Counts of the cold/warm scenario; the defaults are the full run."""

    modes: tuple[str, ...] = tuple(MODES)
    warm: int = 5  # warm requests after the cold one

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), warm=1)


def face_png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (96, 96), (110, 140, 190)).save(buffer, format="PNG")
    return buffer.getvalue()


def tone_wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A 440 Hz tone, 16-bit mono PCM."""
    import numpy as np

    t = np.arange(int(rate * seconds)) / rate
    samples = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


def _request(model: str, seed: int) -> dict[str, Any]:
    if model == "talking-head-demo":
        return {"task": "audio2video", "image": face_png(), "audio": tone_wav(), "seed": seed}
    return {"prompt": PROMPT, "seed": seed}


def _call(client: omnirt.Client, model: str, seed: int) -> dict[str, Any]:
    started = time.perf_counter()
    result = client.generate(model=model, timeout=600, **_request(model, seed))
    wall = time.perf_counter() - started
    report = result.report
    return {
        "wall_ms": sc.ms(wall),
        "cold_start": report.cold_start,
        "load_ms": round(report.timing("load") or 0.0, 1),
        "execution_ms": round(report.execution_ms, 1),
        "queue_wait_ms": round(report.queue_wait_ms, 1),
    }


def measure_mode(controller: Controller, ctx: sc.Context, mode: str, warm: int) -> dict[str, Any]:
    model, flags = MODES[mode]
    worker_id = f"cold-{mode.replace('_', '-')}"
    threads = ("--torch-threads", str(ctx.torch_threads))
    worker = Worker(
        ctx.log_dir, controller.address, worker_id, ctx.model_dir, *threads, *flags, "--models", model
    )
    started = time.perf_counter()
    worker.start()
    try:
        wait_connected(controller, [worker])
        connect_s = round(time.perf_counter() - started, 2)
        with omnirt.Client(controller.address) as client:
            cold = _call(client, model, 1)
            warms = [_call(client, model, 2 + i) for i in range(warm)]
    finally:
        worker.stop()
    warm_wall = sc.median([w["wall_ms"] for w in warms])
    return {
        "mode": mode,
        "model": model,
        "worker_connect_s": connect_s,
        "cold": cold,
        "warm": warms,
        "warm_wall_p50_ms": round(warm_wall, 2),
        "warm_execution_p50_ms": round(sc.median([w["execution_ms"] for w in warms]), 1),
        "warm_cold_start_flags": sorted({w["cold_start"] for w in warms}),
        "cold_over_warm": sc.ratio(cold["wall_ms"], warm_wall, 1),
    }


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    controller = Controller(ctx.log_dir).start()
    try:
        modes = [measure_mode(controller, ctx, mode, settings.warm) for mode in settings.modes]
    finally:
        controller.stop()
    rows = [
        sc.Row(
            NAME,
            f"{m['mode']} ({m['model']}): first request vs warm p50",
            f"cold {sc.fmt_ms(m['cold']['wall_ms'])} (load {sc.fmt_ms(m['cold']['load_ms'])})",
            f"warm {sc.fmt_ms(m['warm_wall_p50_ms'])}",
            m["cold_over_warm"],
        ).as_dict()
        for m in modes
    ]
    return {"settings": sc.settings_dict(settings), "modes": modes, "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    header = [
        "mode",
        "model",
        "worker start -> connected",
        "cold: wall",
        "cold: load stage",
        "cold: execution",
        "cold_start flag",
        "warm: wall p50",
        "warm: execution p50",
        "warm cold_start flags",
        "cold / warm",
    ]
    rows = [
        [
            m["mode"],
            m["model"],
            f"{m['worker_connect_s']} s",
            sc.fmt_ms(m["cold"]["wall_ms"]),
            sc.fmt_ms(m["cold"]["load_ms"]),
            sc.fmt_ms(m["cold"]["execution_ms"]),
            m["cold"]["cold_start"],
            sc.fmt_ms(m["warm_wall_p50_ms"]),
            sc.fmt_ms(m["warm_execution_p50_ms"]),
            ", ".join(str(f) for f in m["warm_cold_start_flags"]),
            f"**{m['cold_over_warm']}**",
        ]
        for m in result["modes"]
    ]
    return "\n\n".join(
        [
            "One controller; per execution mode a fresh worker (`omnirt-worker --mode MODE --models MODEL`, "
            "the tiny model already built on disk), one first request (cold) then "
            f"{result['settings']['warm']} more (warm), at concurrency 1. tiny-sd models at their catalog "
            "defaults (64x64, 4 steps); talking-head-demo with a 96x96 PNG and 1 s of WAV (25 frames at "
            "25 fps).",
            sc.md_table(header, rows, right=2),
            "What the numbers mean: **worker start -> connected** is process start to the controller "
            "listing the worker (Python and torch/diffusers imports included); **load stage** the "
            "RunReport's `load` timing (the model cache's `from_pretrained`; for `persistent_worker` the "
            "torchrun group's spawn, distributed init and load on every rank); **cold_start** the "
            "RunReport's flag. `persistent_worker` runs with `--no-preload` here: by default its group "
            "starts with the worker, before any request, and the first request is warm. `subprocess` has "
            "no model to keep warm: every request starts the external "
            "command, so cold and warm cost the same by design.",
        ]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown)
