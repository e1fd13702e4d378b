"""persistent_worker's pipeline program on tasks with media inputs, on real 2-rank gloo groups.

image2image and inpaint on tiny SD (the ranks build the img2img / inpaint pipeline on the loaded
text-to-image modules, as legacy_call does), with the guidance split and with data parallel (the
same group: `parallel` is not a launch setting), then image2video on tiny LTX-Video (its
image-to-video pipeline on the text-to-video modules). The images travel to the ranks as the
client's encoded bytes; each rank decodes them with legacy_call's code, so every output is
compared with what legacy_call makes in this process for the same request, input and seed.

Tolerance: 2/255 per pixel or produced frame value (before the MP4 encode), as in
test_worker_persistent_families (the split runs batches of N where the pipeline runs 2N; a wrong
half or seed moves pixels by tens). Frames decoded from the two MP4s are no measure: x264 turned
a 1/255 difference into 12/255 on an Intel Xeon.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from worker_testing import (
    IMAGE,
    MASK,
    TASKS,
    Family,
    noise_image,
    only_result,
    pixels,
    png_bytes,
    produced_frames,
    refusal,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.modes.persistent.executor import PersistentWorkerExecutor

MAX_DIFF = 2
SD = Family(
    "tiny-sd",
    "StableDiffusionPipeline",
    (t.Task.TEXT2IMAGE, t.Task.IMAGE2IMAGE, t.Task.INPAINT),
    {"width": 64, "height": 64, "num_inference_steps": 4, "guidance_scale": 5.0, "seed": 7},
)
LTX = Family(
    "tiny-ltx-video",
    "LTXPipeline",
    (t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO),
    {"width": 64, "height": 64, "num_frames": 9, "fps": 8.0, "num_inference_steps": 2, "guidance_scale": 3.0,
     "seed": 7},
)  # fmt: skip
PROMPT, NEGATIVE = "a red fox", "blurry"
CFG2 = {"nproc_per_node": 2.0, "parallel": "cfg", "restart_backoff_s": 0.2}
Inputs = tuple[tuple[int, bytes], ...]


def image_input(seed: int = 4) -> Inputs:
    return ((IMAGE, png_bytes(noise_image(seed))),)


def inpaint_inputs() -> Inputs:
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))  # repaint the right half
    return (*image_input(), (MASK, png_bytes(mask)))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inputs")


@pytest.fixture(scope="module")
def pw(model_dir: Path, roots: Path) -> Iterator[PersistentWorkerExecutor]:
    config = WorkerConfig(
        mode="persistent_worker",
        model_dir=str(model_dir),
        worker_id="w-pi",
        torch_threads=1,
        input_roots=[str(roots)],
    )
    executor = PersistentWorkerExecutor(config)
    yield executor
    executor.close_sync()


def assignment(
    family: Family,
    task: t.Task,
    runtime: dict[str, Any],
    inputs: Inputs = (),
    uris: tuple[tuple[int, str], ...] = (),
    max_input_bytes: int = 0,
    **fields: Any,
) -> Assignment:
    """One `task` job on `family`'s persistent model `<model>-pw`, shaped like the controller sends it."""
    model = f"{family.model}-pw"
    msg = gateway_pb2.Assignment(
        assignment_id="as-inputs",
        model=models_pb2.ModelSpec(
            id=model,
            source=f"builtin:{family.model}",
            pipeline_class=family.pipeline_class,
            execution_mode="persistent_worker",
            tasks=[TASKS[x] for x in family.tasks],
            limits=models_pb2.ModelLimits(max_input_bytes=max_input_bytes),
        ),
    )
    request = types_pb2.GenerateRequest(
        task=TASKS[task],
        model=model,
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        **{**family.defaults, **fields},
    )
    for role, data in inputs:
        request.inputs.add(role=role, data=data)
    for role, uri in uris:
        request.inputs.add(role=role, uri=uri)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    converted = assignment_from_proto(msg)
    converted.model.runtime = dict(runtime)
    return converted


def run(executor: PersistentWorkerExecutor, work: Assignment) -> ItemOutcome:
    [outcome] = executor.run_sync(work, lambda event: None, CancelFlags())
    return outcome


def legacy(executor: LegacyCallExecutor, family: Family, task: t.Task, **fields: Any) -> t.GenerateResult:
    """What legacy_call makes in this process for the same request."""
    return only_result(run_family(executor, family, task, prompt=PROMPT, negative_prompt=NEGATIVE, **fields))


def max_diff(a: t.Artifact, b: t.Artifact) -> float:
    if a.kind is t.MediaKind.VIDEO:
        return float(np.abs(produced_frames(a).astype(np.float32) - produced_frames(b)).max())
    return float(np.abs(pixels(a) - pixels(b)).max())


def test_image2image_splits_guidance_across_the_ranks_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    task = t.Task.IMAGE2IMAGE
    ours = only_result(run(pw, assignment(SD, task, CFG2, image_input(), strength=0.75)))
    theirs = legacy(executor, SD, task, inputs=image_input(), strength=0.75)
    assert ours.report.pipeline_class == theirs.report.pipeline_class == "StableDiffusionImg2ImgPipeline"
    config = ours.report.config_resolved
    assert (config["parallel"], config["cfg_parallel"], config["strength"]) == ("cfg", True, 0.75)
    # strength 0.75 of 4 steps: 3 denoising steps, the first unsplit, then one half per rank.
    assert [r["computed_samples"] for r in config["guidance_split"]] == [2 + 2, 2 + 2]
    assert config["num_inference_steps"] == 3
    diff = max_diff(ours.artifacts[0], theirs.artifacts[0])
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"
    again = only_result(run(pw, assignment(SD, task, CFG2, image_input(), strength=0.75)))
    assert again.artifacts[0].sha256 == ours.artifacts[0].sha256, "same seed, same input, same bytes"
    other = only_result(run(pw, assignment(SD, task, CFG2, image_input(seed=5), strength=0.75)))
    assert other.artifacts[0].sha256 != ours.artifacts[0].sha256
    assert max_diff(other.artifacts[0], ours.artifacts[0]) > 2 * MAX_DIFF, "another input, another image"


def test_inpaint_keeps_the_unmasked_half_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    task = t.Task.INPAINT
    ours = only_result(run(pw, assignment(SD, task, CFG2, inpaint_inputs(), strength=1.0)))
    theirs = legacy(executor, SD, task, inputs=inpaint_inputs(), strength=1.0)
    assert ours.report.pipeline_class == "StableDiffusionInpaintPipeline"
    diff = max_diff(ours.artifacts[0], theirs.artifacts[0])
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"
    out, source = pixels(ours.artifacts[0]), np.asarray(noise_image(4), dtype=np.float32)
    assert np.array_equal(out[:, :32], source[:, :32]), "the input is kept outside the mask"
    assert np.abs(out[:, 32:] - source[:, 32:]).mean() > 10, "the masked half is repainted"


def test_data_parallel_gives_each_rank_one_image2image_output(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    data = {**CFG2, "parallel": "data"}  # same launch: the running SD group takes it
    task = t.Task.IMAGE2IMAGE
    ours = only_result(run(pw, assignment(SD, task, data, image_input(), strength=0.75, num_outputs=2)))
    theirs = legacy(executor, SD, task, inputs=image_input(), strength=0.75, num_outputs=2)
    config = ours.report.config_resolved
    assert (config["parallel"], config["outputs_per_rank"], config["seeds"]) == ("data", [1, 1], [7, 8])
    for mine, reference in zip(ours.artifacts, theirs.artifacts, strict=True):
        diff = max_diff(mine, reference)
        assert diff <= MAX_DIFF, f"output differs from legacy_call by {diff}/255"
    assert max_diff(ours.artifacts[0], ours.artifacts[1]) > 10 * MAX_DIFF, "two seeds, two images"


def test_a_file_input_is_read_by_the_daemon_and_bounded(pw: PersistentWorkerExecutor, roots: Path) -> None:
    task = t.Task.IMAGE2IMAGE
    (roots / "fox.png").write_bytes(image_input()[0][1])
    uri = ((IMAGE, (roots / "fox.png").as_uri()),)
    inline = only_result(run(pw, assignment(SD, task, CFG2, image_input(), strength=0.75)))
    read = only_result(run(pw, assignment(SD, task, CFG2, uris=uri, strength=0.75)))
    assert read.artifacts[0].sha256 == inline.artifacts[0].sha256, "the same image, read from the file"
    [(_, data)] = image_input()
    over = run(pw, assignment(SD, task, CFG2, uris=uri, max_input_bytes=len(data) - 1, strength=0.75))
    assert refusal(over) == ("INVALID_ARGUMENT", "inputs[0].uri")
    inline_over = run(pw, assignment(SD, task, CFG2, image_input(), max_input_bytes=len(data) - 1))
    assert refusal(inline_over) == ("INVALID_ARGUMENT", "inputs")
    assert "over the limit" in (inline_over.error.message if inline_over.error else "")


def test_a_missing_input_is_refused_naming_the_field(pw: PersistentWorkerExecutor) -> None:
    no_mask = run(pw, assignment(SD, t.Task.INPAINT, CFG2, image_input(), strength=1.0))
    assert refusal(no_mask) == ("INVALID_ARGUMENT", "inputs")
    assert no_mask.error is not None and "role mask" in no_mask.error.message
    no_image = run(pw, assignment(SD, t.Task.IMAGE2IMAGE, CFG2, strength=0.75))
    assert refusal(no_image) == ("INVALID_ARGUMENT", "inputs")
    assert no_image.error is not None and "role image" in no_image.error.message


def test_a_bad_image_is_refused_by_the_ranks_and_the_group_keeps_serving(
    pw: PersistentWorkerExecutor,
) -> None:
    bad = run(pw, assignment(SD, t.Task.IMAGE2IMAGE, CFG2, ((IMAGE, b"not an image"),), strength=0.75))
    assert refusal(bad) == ("INVALID_ARGUMENT", "inputs[0]")
    group = pw.group("tiny-sd-pw")
    assert group is not None and group.ready
    good = only_result(run(pw, assignment(SD, t.Task.IMAGE2IMAGE, CFG2, image_input(), strength=0.75)))
    assert good.report.cold_start is False, "the same group served it"


def test_image2video_runs_the_image_to_video_pipeline_and_equals_legacy_call(
    pw: PersistentWorkerExecutor, executor: LegacyCallExecutor
) -> None:
    task = t.Task.IMAGE2VIDEO
    ours = only_result(run(pw, assignment(LTX, task, CFG2, image_input())))
    theirs = legacy(executor, LTX, task, inputs=image_input())
    assert ours.report.pipeline_class == theirs.report.pipeline_class == "LTXImageToVideoPipeline"
    assert ours.artifacts[0].num_frames == 9
    assert [r["pattern"] for r in ours.report.config_resolved["guidance_split"]] == ["batched"] * 2
    diff = max_diff(ours.artifacts[0], theirs.artifacts[0])
    assert diff <= MAX_DIFF, f"differs from legacy_call by {diff}/255"
