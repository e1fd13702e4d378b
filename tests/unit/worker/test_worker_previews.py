"""Live previews (`preview` runtime option) through the legacy_call executor on tiny-sd and
tiny-wan: PREVIEW events at the asked steps, decodable small images of the output's aspect, off
by default, the request's setting over the model's."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.previews import PreviewMaker


def run(
    executor: LegacyCallExecutor,
    *,
    model: str = "tiny-sd",
    runtime: dict[str, Any] | None = None,
    request_runtime: Any = None,
    jobs: int = 1,
    steps: int = 6,
    width: int = 96,
    height: int = 64,
) -> tuple[list[ItemOutcome], list[t.JobEvent]]:
    """`jobs` jobs of `model` in one assignment (one pipeline call); outcomes and events."""
    video = model == "tiny-wan"
    task = types_pb2.TASK_TEXT2VIDEO if video else types_pb2.TASK_TEXT2IMAGE
    spec = models_pb2.ModelSpec(
        id=model,
        family="wan" if video else "sd",
        source=f"builtin:{model}",
        pipeline_class="WanPipeline" if video else "StableDiffusionPipeline",
        execution_mode="legacy_call",
        tasks=[task],
    )
    if runtime:
        spec.runtime.update(runtime)
    msg = gateway_pb2.Assignment(assignment_id=f"as-{model}-{jobs}", model=spec)
    for index in range(jobs):
        request = types_pb2.GenerateRequest(
            task=task,
            model=model,
            prompt=f"a fox number {index}",
            width=width,
            height=height,
            num_inference_steps=steps,
            seed=11 + index,
            num_frames=5 if video else 0,
        )
        if request_runtime is not None:
            request.extra.update({"runtime": request_runtime})
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    outcomes, events = run_assignment(executor, assignment_from_proto(msg))
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
    return outcomes, events


def previews(events: list[t.JobEvent], job_id: str = "job-0") -> list[t.JobEvent]:
    return [e for e in events if e.kind is t.EventKind.PREVIEW and e.job_id == job_id]


def image(event: t.JobEvent) -> Image.Image:
    decoded = Image.open(io.BytesIO(event.preview))
    decoded.load()
    return decoded


def test_previews_come_every_n_steps_as_small_jpegs_of_the_outputs_aspect(
    executor: LegacyCallExecutor,
) -> None:
    outcomes, events = run(executor, runtime={"preview": 2}, steps=6)
    got = previews(events)
    # Steps 2 and 4; never the last step (the result follows at once).
    assert [e.progress.step for e in got if e.progress] == [2, 4]
    assert all(e.progress and e.progress.total_steps == 6 for e in got)
    for event in got:
        assert event.preview_mime_type == "image/jpeg"
        decoded = image(event)
        assert decoded.format == "JPEG" and decoded.size == (96, 64)  # the request's 96x64
        assert len(event.preview) < 8_000
    # Each preview follows its step's progress event.
    kinds = [(e.kind, e.progress.step if e.progress else 0) for e in events if e.job_id == "job-0"]
    assert kinds.index((t.EventKind.PREVIEW, 2)) == kinds.index((t.EventKind.PROGRESS, 2)) + 1
    # The two previews differ (the latents move between steps), and the result is unchanged.
    assert np.abs(np.asarray(image(got[0]), float) - np.asarray(image(got[1]), float)).mean() > 0.5
    report = outcomes[0].result.report if outcomes[0].result else None
    assert report is not None
    assert report.config_resolved["runtime_options"]["preview"] == {
        "every_steps": 2,
        "format": "jpeg",
        "max_size": 256,
    }


def test_previews_are_off_by_default(executor: LegacyCallExecutor) -> None:
    _, events = run(executor, steps=4)
    assert not [e for e in events if e.kind is t.EventKind.PREVIEW]


def test_the_requests_setting_overrides_the_models(executor: LegacyCallExecutor) -> None:
    _, events = run(executor, runtime={"preview": 1}, request_runtime={"preview": False}, steps=3)
    assert not previews(events)
    _, events = run(
        executor, request_runtime={"preview": {"every_steps": 3, "format": "webp", "max_size": 32}}, steps=7
    )
    got = previews(events)
    assert [e.progress.step for e in got if e.progress] == [3, 6]
    assert {e.preview_mime_type for e in got} == {"image/webp"}
    assert image(got[0]).format == "WEBP" and image(got[0]).size == (32, 21)  # max_size 32, 3:2


def test_each_job_of_a_batch_gets_previews_of_its_own_image(executor: LegacyCallExecutor) -> None:
    _, events = run(executor, runtime={"preview": 2}, jobs=2, steps=4, width=64, height=64)
    first, second = previews(events, "job-0"), previews(events, "job-1")
    assert len(first) == len(second) == 1
    assert first[0].preview != second[0].preview  # other prompt, other seed


def test_a_video_model_previews_its_middle_frame(executor: LegacyCallExecutor) -> None:
    _, events = run(executor, model="tiny-wan", runtime={"preview": 1}, steps=3, width=64, height=48)
    got = previews(events)
    assert [e.progress.step for e in got if e.progress] == [1, 2]
    assert image(got[0]).size == (64, 48)


def test_flux_packed_latents_are_unpacked_by_the_pipeline() -> None:
    torch = pytest.importorskip("torch")
    from diffusers import FluxPipeline

    maker = PreviewMaker({"every_steps": 1, "format": "jpeg", "max_size": 256}, "flux", 64, 32)
    # Flux packs 2x2 patches of 16 channels: (batch, (32/16)*(64/16) tokens, 64).
    packed = torch.randn(2, 2 * 4, 64)
    made = maker.make(FluxPipeline, packed, [0, 1, 2])
    assert made[0] is not None and (made[0].width, made[0].height) == (64, 32)
    assert made[1] is not None and made[2] is None  # no third output in the batch
    assert maker.projection == "factors"
