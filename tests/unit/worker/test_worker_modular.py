"""The `modular` mode through its executor: shared components, stages, prompt cache, legacy parity."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import FamilyRouter, create_executor
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.modular.executor import ModularExecutor

TASKS = {
    "text2image": types_pb2.TASK_TEXT2IMAGE,
    "image2image": types_pb2.TASK_IMAGE2IMAGE,
    "inpaint": types_pb2.TASK_INPAINT,
}
IMAGE = types_pb2.MEDIA_ROLE_IMAGE
MASK = types_pb2.MEDIA_ROLE_MASK


@pytest.fixture(scope="module")
def modular(model_dir: Path) -> ModularExecutor:
    """A modular executor made the way the daemon makes it (`--mode modular`)."""
    # Events handed to the loop at once: the cancel test acts on a step while the call runs.
    config = WorkerConfig(
        mode="modular", model_dir=str(model_dir), worker_id="w-mod", torch_threads=1, progress_interval_ms=0
    )
    made = create_executor(config)
    # The null family's executor in front of the mode's own (`FamilyRouter`): the tests here
    # need the modular executor itself.
    assert isinstance(made, FamilyRouter) and isinstance(made.executor, ModularExecutor)
    return made.executor


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def noise_png(seed: int) -> bytes:
    pixels = np.random.RandomState(seed).randint(0, 256, (64, 64, 3), dtype=np.uint8)
    return png_bytes(Image.fromarray(pixels))


def half_mask_png() -> bytes:
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))
    return png_bytes(mask)


def assignment(
    task: str = "text2image",
    *,
    job_id: str = "job-1",
    prompt: str = "a red fox",
    inputs: tuple[tuple[int, bytes], ...] = (),
    runtime: dict | None = None,
    **fields: object,
) -> Assignment:
    """One job on tiny-sd-modular, shaped like the controller sends it."""
    model = models_pb2.ModelSpec(
        id="tiny-sd-modular",
        source="builtin:tiny-sd",
        pipeline_class="StableDiffusionPipeline",
        execution_mode="modular",
        tasks=list(TASKS.values()),
    )
    if runtime:
        model.runtime.update(runtime)
    msg = gateway_pb2.Assignment(assignment_id="as-" + job_id, model=model)
    values: dict = {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 5.0, "seed": 7}
    values.update(fields)
    request = types_pb2.GenerateRequest(task=TASKS[task], model="tiny-sd-modular", prompt=prompt, **values)
    for role, data in inputs:
        request.inputs.add(role=role, data=data)
    msg.items.add(job_id=job_id, attempt=1, request=request)
    return assignment_from_proto(msg)


def only_result(outcomes: list[ItemOutcome]) -> t.GenerateResult:
    [outcome] = outcomes
    assert outcome.error is None, outcome.error
    assert outcome.result is not None and outcome.result.report is not None
    return outcome.result


def pixels(result: t.GenerateResult) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(result.artifacts[0].data)).convert("RGB"), dtype=np.int16)


IMAGE_INPUTS = {
    "text2image": (),
    "image2image": ((IMAGE, noise_png(1)),),
    "inpaint": ((IMAGE, noise_png(2)), (MASK, half_mask_png())),
}


def test_the_three_tasks_share_one_unet_one_vae_one_text_encoder(modular: ModularExecutor) -> None:
    spec = assignment().model
    parts = {task: modular.components(spec, t.Task(task)) for task in TASKS}
    for name in ("unet", "vae", "text_encoder", "tokenizer"):
        first = parts["text2image"][name]
        assert all(p[name] is first for p in parts.values()), name
    # By memory: every parameter of every task's modules is one tensor storage in all.
    storages = {
        param.data_ptr()
        for p in parts.values()
        for name in ("unet", "vae", "text_encoder")
        for param in p[name].parameters()
    }
    one_task = sum(
        1 for name in ("unet", "vae", "text_encoder") for _ in parts["text2image"][name].parameters()
    )
    assert len(storages) == one_task
    for task in TASKS:  # and running each task loads nothing more
        only_result(run_assignment(modular, assignment(task, inputs=IMAGE_INPUTS[task]))[0])
    assert len(modular.cache) == 1


def test_stages_have_events_timings_and_one_progress_per_step(modular: ModularExecutor) -> None:
    outcomes, events = run_assignment(modular, assignment(prompt="stage timings", num_inference_steps=3))
    report = only_result(outcomes).report
    assert report is not None
    assert report.execution_mode == "modular"
    names = [timing.name for timing in report.timings]
    assert [n for n in names if n != "load"] == ["encode", "denoise", "decode", "export"]
    assert all(timing.duration_ms >= 0 for timing in report.timings)
    stage_events = [
        (e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE and e.stage != "load"
    ]
    assert stage_events == [(s, f) for s in ("encode", "denoise", "decode", "export") for f in (False, True)]
    steps = [e.progress.step for e in events if e.kind is t.EventKind.PROGRESS and e.progress]
    assert steps == [1, 2, 3]
    assert report.config_resolved["num_inference_steps"] == 3


def test_a_repeated_prompt_skips_the_text_encoder(modular: ModularExecutor) -> None:
    first = only_result(run_assignment(modular, assignment(prompt="a cached lighthouse", seed=1))[0]).report
    second = only_result(run_assignment(modular, assignment(prompt="a cached lighthouse", seed=2))[0]).report
    other = only_result(
        run_assignment(modular, assignment(prompt="a cached lighthouse", guidance_scale=1.0))[0]
    )
    assert first is not None and second is not None and other.report is not None
    assert first.cache_hits == {"prompt_embeds": 0}
    assert second.cache_hits == {"prompt_embeds": 1}
    assert other.report.cache_hits == {"prompt_embeds": 0}  # guidance off: other embeddings
    encode_hit = second.timing("encode")
    assert encode_hit is not None and encode_hit < 5.0  # a dict look-up, no text encoder
    assert encode_hit < (first.timing("encode") or 0.0)


def test_the_prompt_cache_is_lru_bounded(modular: ModularExecutor) -> None:
    small = {"prompt_cache_size": 2}
    for prompt in ("lru a", "lru b", "lru c"):  # "lru a" is evicted by "lru c"
        run_assignment(modular, assignment(prompt=prompt, runtime=small, num_inference_steps=1))
    hits = {
        prompt: only_result(
            run_assignment(modular, assignment(prompt=prompt, runtime=small, num_inference_steps=1))[0]
        ).report.cache_hits  # type: ignore[union-attr]
        for prompt in ("lru c", "lru a")
    }
    assert hits == {"lru c": {"prompt_embeds": 1}, "lru a": {"prompt_embeds": 0}}


@pytest.mark.parametrize("task", list(TASKS))
def test_same_seed_same_image_as_legacy_call(
    task: str, modular: ModularExecutor, executor: LegacyCallExecutor
) -> None:
    job = assignment(task, inputs=IMAGE_INPUTS[task], seed=11, negative_prompt="blurry")
    ours = pixels(only_result(run_assignment(modular, job)[0]))
    legacy_job = assignment(task, inputs=IMAGE_INPUTS[task], seed=11, negative_prompt="blurry")
    legacy_job.model.execution_mode = "legacy_call"
    theirs = pixels(only_result(run_assignment(executor, legacy_job)[0]))
    assert np.abs(ours - theirs).max() == 0  # identical: the same computation in the same order


def test_cancel_mid_denoise_is_cancelled(modular: ModularExecutor) -> None:
    raised: list[datetime] = []

    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.progress and event.progress.step == 2:
            flags.request(event.job_id)
            raised.append(datetime.now(UTC))

    outcomes, events = run_assignment(modular, assignment(num_inference_steps=30), on_event=cancel_at_step_2)
    [outcome] = outcomes
    assert outcome.error is not None and outcome.error.code == "CANCELLED"
    steps = [e for e in events if e.kind is t.EventKind.PROGRESS and e.progress]
    # The flag is raised on the loop when step 2's event reaches it; from then on the run ends
    # at the next step end.
    assert 2 <= len(steps) < 30
    assert len([e for e in steps if e.time > raised[0]]) <= 1


def test_bad_image_bytes_are_invalid_argument_naming_the_input(modular: ModularExecutor) -> None:
    [outcome] = run_assignment(modular, assignment("image2image", inputs=((IMAGE, b"not an image"),)))[0]
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[0]")
    # and the executor keeps serving
    only_result(run_assignment(modular, assignment(num_inference_steps=1))[0])


def test_a_models_preview_option_sends_previews_from_the_sd_stages(modular: ModularExecutor) -> None:
    outcomes, events = run_assignment(
        modular, assignment(runtime={"preview": 1}, num_inference_steps=3, prompt="previews")
    )
    report = only_result(outcomes).report
    assert report is not None and report.config_resolved["runtime_options"]["preview"]["every_steps"] == 1
    previews = [e for e in events if e.kind is t.EventKind.PREVIEW]
    assert [e.progress.step for e in previews if e.progress] == [1, 2]
    image = Image.open(io.BytesIO(previews[0].preview))
    assert image.format == "JPEG" and image.size == (64, 64)
    quiet = run_assignment(modular, assignment(job_id="job-quiet", prompt="no previews"))[1]
    assert not [e for e in quiet if e.kind is t.EventKind.PREVIEW], "off by default"
