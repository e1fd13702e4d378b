"""Live previews: what the `preview` runtime option costs a job, on tiny-sd and tiny-wan (CPU).

In this process (no daemons: it measures the previews, not the transport), through the
`legacy_call` executor the worker runs, so each preview is made exactly as a worker makes it
(projection, resize, JPEG encode, the PREVIEW event queued). Per model, jobs without previews,
with one every 5 steps (the default of `preview = true`) and with one every step alternate
(the order rotates every round); the figure is the median of the job's `execution_ms` (the
worker's time for the job, load excluded: the model is warm) and its increase over none.

    .venv/bin/python -m bench.previews [--rounds 15] [--steps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Any

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.previews import PreviewMaker

SETTINGS: dict[str, Any] = {"none": None, "every 5": 5, "every 1": 1}
MODELS = {"tiny-sd": ("sd", "StableDiffusionPipeline"), "tiny-wan": ("wan", "WanPipeline")}


def one_job(executor: LegacyCallExecutor, model: str, steps: int, preview: Any) -> tuple[float, int]:
    """(execution_ms, previews sent) of one job."""
    family, pipeline_class = MODELS[model]
    video = model == "tiny-wan"
    task = types_pb2.TASK_TEXT2VIDEO if video else types_pb2.TASK_TEXT2IMAGE
    spec = models_pb2.ModelSpec(
        id=model, family=family, source=f"builtin:{model}", pipeline_class=pipeline_class,
        execution_mode="legacy_call", tasks=[task],
    )  # fmt: skip
    request = types_pb2.GenerateRequest(
        task=task, model=model, prompt="a fox", width=64, height=64, num_inference_steps=steps,
        seed=1, num_frames=9 if video else 0,
    )  # fmt: skip
    if preview is not None:
        request.extra.update({"runtime": {"preview": preview}})
    msg = gateway_pb2.Assignment(assignment_id="as-bench", model=spec)
    msg.items.add(job_id="job-bench", attempt=1, request=request)
    events: list[t.JobEvent] = []
    [outcome] = asyncio.run(executor.run(assignment_from_proto(msg), events.append, CancelFlags()))
    assert outcome.result is not None and outcome.result.report is not None, outcome.error
    sent = sum(1 for e in events if e.kind is t.EventKind.PREVIEW)
    return outcome.result.report.execution_ms, sent


def one_preview_ms(family: str, shape: tuple[int, ...], size: int) -> float:
    """Median time of one preview (projection, resize, JPEG) of a latent of `shape`."""
    import torch

    maker = PreviewMaker({"every_steps": 1, "format": "jpeg", "max_size": 256}, family, size, size)
    latents = torch.randn(*shape)
    times = []
    for _ in range(200):
        start = time.perf_counter()
        maker.make(None, latents, [0])
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def main() -> None:
    """Print a Markdown table: per model and setting, the median job time and its increase."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as models:
        executor = LegacyCallExecutor(WorkerConfig(model_dir=models, worker_id="w-bench", torch_threads=1))
        print(f"{args.steps} steps, 64x64 (tiny-wan: 9 frames), {args.rounds} rounds, torch threads 1\n")
        print("| model | previews | sent | median job ms | vs none |")
        print("|---|---|---|---|---|")
        for model in MODELS:
            one_job(executor, model, args.steps, None)  # load and warm up
            times: dict[str, list[float]] = {name: [] for name in SETTINGS}
            sent: dict[str, int] = {}
            names = list(SETTINGS)
            for round_ in range(args.rounds):
                for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
                    ms, count = one_job(executor, model, args.steps, SETTINGS[name])
                    times[name].append(ms)
                    sent[name] = count
            base = statistics.median(times["none"])
            for name in names:
                median = statistics.median(times[name])
                change = "" if name == "none" else f"{(median / base - 1) * 100:+.1f} %"
                print(f"| {model} | {name} | {sent[name]} | {median:.1f} | {change} |")
    print("\none preview, median of 200 (projection, resize, JPEG):")
    for family, shape, size in (
        ("sd", (1, 4, 8, 8), 64),
        ("wan", (1, 16, 3, 8, 8), 64),
        ("sdxl", (1, 4, 128, 128), 1024),
    ):
        print(f"- {family} latents {shape}, output {size} px: {one_preview_ms(family, shape, size):.2f} ms")


if __name__ == "__main__":
    main()
