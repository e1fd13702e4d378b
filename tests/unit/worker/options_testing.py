"""Helpers for the runtime option tests: one job on tiny-sd or tiny-wan, its pixels, its report."""

from __future__ import annotations

import io
from typing import Any

import av
import numpy as np
from PIL import Image
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor


def run_job(
    executor: LegacyCallExecutor,
    model: str = "tiny-sd",
    *,
    runtime: dict[str, Any] | None = None,
    request_runtime: Any = None,
    job_id: str = "job-1",
    steps: int = 2,
    seed: int = 11,
    adapters: list[str] | None = None,
    pipeline_class: str = "",
    prompt: str = "a fox",
    extra: dict[str, Any] | None = None,
    **fields: Any,
) -> ItemOutcome:
    """One job for builtin `model` (tiny-sd: text2image 64x64; tiny-wan, tiny-skyreels: 5 frames).

    `runtime` is the catalog entry's table, `request_runtime` the request's `extra.runtime`;
    `pipeline_class` another diffusers class over the same weights, `extra` pipeline arguments.
    """
    video = model.startswith(("tiny-wan", "tiny-skyreels"))
    task = types_pb2.TASK_TEXT2VIDEO if video else types_pb2.TASK_TEXT2IMAGE
    spec = models_pb2.ModelSpec(
        id=model,
        source=f"builtin:{model}",
        pipeline_class=pipeline_class or ("WanPipeline" if video else "StableDiffusionPipeline"),
        execution_mode="legacy_call",
        tasks=[task],
    )
    if runtime:
        spec.runtime.update(runtime)
    msg = gateway_pb2.Assignment(assignment_id="as-" + job_id, model=spec)
    request = types_pb2.GenerateRequest(
        task=task,
        model=model,
        prompt=prompt,
        width=64,
        height=64,
        num_inference_steps=steps,
        seed=seed,
        **fields,
    )
    if video and not request.num_frames:
        request.num_frames = 5
    if extra:
        request.extra.update(extra)
    if request_runtime is not None:
        request.extra.update({"runtime": request_runtime})
    for name in adapters or []:
        request.adapters.add(name=name, scale=1.0)
    msg.items.add(job_id=job_id, attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def report(outcome: ItemOutcome) -> t.RunReport:
    """The RunReport of a successful job."""
    assert outcome.error is None, outcome.error
    assert outcome.result is not None and outcome.result.report is not None
    return outcome.result.report


def pixels(outcome: ItemOutcome) -> np.ndarray:
    """The first image of a job (float32 RGB), or all frames of its video stacked."""
    report(outcome)
    assert outcome.result is not None
    data = outcome.result.artifacts[0].data
    if data[4:8] == b"ftyp":  # MP4
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return np.stack(frames).astype(np.float32)
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)


def failure(outcome: ItemOutcome) -> t.JobError:
    """The error of a failed job."""
    assert outcome.error is not None, "the job succeeded"
    return outcome.error
