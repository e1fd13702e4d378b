"""legacy_call beyond text2image: image2image, inpaint (tiny-sd), text2video and image2video (tiny Wan)."""

from __future__ import annotations

import hashlib
import io

import av
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

PIPELINES = {
    "tiny-sd": "StableDiffusionPipeline",
    "tiny-wan": "WanPipeline",
    "tiny-wan-i2v": "WanImageToVideoPipeline",
}
TASKS = {
    "image2image": types_pb2.TASK_IMAGE2IMAGE,
    "inpaint": types_pb2.TASK_INPAINT,
    "text2image": types_pb2.TASK_TEXT2IMAGE,
    "text2video": types_pb2.TASK_TEXT2VIDEO,
    "image2video": types_pb2.TASK_IMAGE2VIDEO,
}


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def noise_image(seed: int, size: tuple[int, int] = (64, 64)) -> Image.Image:
    pixels = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def half_mask(size: tuple[int, int] = (64, 64)) -> Image.Image:
    """Black (keep) on the left half, white (repaint) on the right half."""
    mask = Image.new("L", size, 0)
    mask.paste(255, (size[0] // 2, 0, size[0], size[1]))
    return mask


def run(
    executor: LegacyCallExecutor,
    model: str,
    task: str,
    *,
    job_ids: tuple[str, ...] = ("job-1",),
    inputs: tuple[tuple[int, bytes], ...] = (),
    **fields: object,
) -> list[ItemOutcome]:
    """Run one assignment of `task` on builtin `model`, shaped like the controller sends it."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-" + "-".join(job_ids),
        model=models_pb2.ModelSpec(
            id=model,
            source=f"builtin:{model}",
            pipeline_class=PIPELINES[model],
            execution_mode="legacy_call",
            tasks=[TASKS[task]],
        ),
    )
    defaults = {"width": 64, "height": 64, "num_inference_steps": 3, "guidance_scale": 5.0, "seed": 7}
    if "video" in task:
        defaults["num_frames"] = 9
    for index, job_id in enumerate(job_ids):
        values: dict = {**defaults, **fields}
        values["seed"] += 100 * index
        request = types_pb2.GenerateRequest(
            task=TASKS[task], model=model, prompt=f"a red fox {index}", **values
        )
        for role, data in inputs:
            request.inputs.add(role=role, data=data)
        msg.items.add(job_id=job_id, attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


def only_result(outcomes: list[ItemOutcome]) -> t.GenerateResult:
    [outcome] = outcomes
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return outcome.result


def pixels(artifact: t.Artifact) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(artifact.data)).convert("RGB"), dtype=np.float32)


def decoded_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


IMAGE = types_pb2.MEDIA_ROLE_IMAGE
MASK = types_pb2.MEDIA_ROLE_MASK


# ---- image2image and inpaint on tiny-sd -------------------------------------------------------


def test_image2image_depends_on_the_init_image_and_differs_from_text2image(
    executor: LegacyCallExecutor,
) -> None:
    red, blue = (png_bytes(Image.new("RGB", (64, 64), colour)) for colour in ("red", "blue"))
    text = only_result(run(executor, "tiny-sd", "text2image"))
    first = only_result(run(executor, "tiny-sd", "image2image", inputs=((IMAGE, red),), strength=0.5))
    again = only_result(run(executor, "tiny-sd", "image2image", inputs=((IMAGE, red),), strength=0.5))
    other = only_result(run(executor, "tiny-sd", "image2image", inputs=((IMAGE, blue),), strength=0.5))
    (a,), (b,), (c,), (d,) = first.artifacts, again.artifacts, other.artifacts, text.artifacts
    assert (a.width, a.height, a.mime_type) == (64, 64, "image/png")
    assert a.sha256 == hashlib.sha256(a.data).hexdigest() == b.sha256, "same seed and image, same bytes"
    assert np.abs(pixels(a) - pixels(c)).mean() > 2, "another init image must change the output"
    assert np.abs(pixels(a) - pixels(d)).mean() > 2, "image2image must differ from text2image"
    report = first.report
    assert report.task is t.Task.IMAGE2IMAGE
    assert report.pipeline_class == "StableDiffusionImg2ImgPipeline"
    assert report.config_resolved["pipeline_class"] == "StableDiffusionImg2ImgPipeline"
    assert "image" not in report.config_resolved


def test_image2image_strength_and_a_resized_init_image(executor: LegacyCallExecutor) -> None:
    init = png_bytes(noise_image(3, (96, 40)))  # resized to the requested 64x64
    options = {"inputs": ((IMAGE, init),), "num_inference_steps": 10}
    weak = only_result(run(executor, "tiny-sd", "image2image", strength=0.3, **options))
    strong = only_result(run(executor, "tiny-sd", "image2image", strength=0.9, **options))
    assert (weak.artifacts[0].width, weak.artifacts[0].height) == (64, 64)
    assert weak.report.config_resolved["strength"] == pytest.approx(0.3)
    assert weak.artifacts[0].sha256 != strong.artifacts[0].sha256


def test_inpaint_keeps_the_unmasked_area_and_repaints_the_masked_one(executor: LegacyCallExecutor) -> None:
    init = noise_image(4)
    result = only_result(
        run(
            executor,
            "tiny-sd",
            "inpaint",
            inputs=((IMAGE, png_bytes(init)), (MASK, png_bytes(half_mask()))),
            strength=1.0,
        )
    )
    out = pixels(result.artifacts[0])
    source = np.asarray(init, dtype=np.float32)
    kept = np.abs(out[:, :32] - source[:, :32]).mean()
    repainted = np.abs(out[:, 32:] - source[:, 32:]).mean()
    assert kept < 1.0, f"unmasked half moved by {kept:.1f} on average"
    assert repainted > 20.0, f"masked half only moved by {repainted:.1f}"
    assert result.report.pipeline_class == "StableDiffusionInpaintPipeline"


def test_bad_image_bytes_are_invalid_argument_naming_the_input(executor: LegacyCallExecutor) -> None:
    [outcome] = run(executor, "tiny-sd", "image2image", inputs=((IMAGE, b"definitely not a PNG"),))
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[0]")
    assert "not an image" in outcome.error.message
    # The executor keeps serving.
    assert only_result(run(executor, "tiny-sd", "text2image")).artifacts


def test_a_mask_of_another_size_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    inputs = ((IMAGE, png_bytes(noise_image(5))), (MASK, png_bytes(half_mask((32, 32)))))
    [outcome] = run(executor, "tiny-sd", "inpaint", inputs=inputs)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[1]")
    assert "32x32" in outcome.error.message and "64x64" in outcome.error.message


def test_a_task_the_model_cannot_derive_is_failed_precondition(executor: LegacyCallExecutor) -> None:
    [outcome] = run(executor, "tiny-wan", "image2image", inputs=((IMAGE, png_bytes(noise_image(6))),))
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "tiny-wan" in outcome.error.message and "image2image" in outcome.error.message


# ---- text2video and image2video on tiny Wan -------------------------------------------------


@pytest.fixture(scope="module")
def videos(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """text2video as MP4 twice (same seed) and as GIF."""
    return {
        "mp4": only_result(run(executor, "tiny-wan", "text2video", num_frames=9, fps=8.0)),
        "mp4-again": only_result(run(executor, "tiny-wan", "text2video", num_frames=9, fps=8.0)),
        "gif": only_result(
            run(
                executor,
                "tiny-wan",
                "text2video",
                num_frames=9,
                fps=8.0,
                output=types_pb2.OutputOptions(format="gif"),
            )
        ),
    }


def test_text2video_mp4_decodes_to_the_requested_frames(videos: dict[str, t.GenerateResult]) -> None:
    result = videos["mp4"]
    [video] = result.artifacts
    assert (video.kind, video.mime_type, video.file_name) == (t.MediaKind.VIDEO, "video/mp4", "job-1-0.mp4")
    assert video.sha256 == hashlib.sha256(video.data).hexdigest() and video.size_bytes == len(video.data)
    assert (video.width, video.height, video.num_frames, video.fps) == (64, 64, 9, 8.0)
    assert video.duration_ms == 1125
    frames = decoded_frames(video.data)
    assert len(frames) == 9 and frames[0].shape == (64, 64, 3)
    assert np.std(np.stack(frames).astype(np.float32)) > 1, "not a flat video"
    report = result.report
    assert report.task is t.Task.TEXT2VIDEO and report.pipeline_class == "WanPipeline"
    config = report.config_resolved
    assert (config["num_frames"], config["fps"], config["output_format"]) == (9, 8.0, "mp4")


def test_text2video_is_reproducible_by_seed(videos: dict[str, t.GenerateResult]) -> None:
    # x264 without its non-deterministic mode: the same frames give the same bytes.
    assert videos["mp4"].artifacts[0].sha256 == videos["mp4-again"].artifacts[0].sha256


def test_text2video_as_gif(videos: dict[str, t.GenerateResult]) -> None:
    [gif] = videos["gif"].artifacts
    assert (gif.mime_type, gif.file_name, gif.num_frames) == ("image/gif", "job-1-0.gif", 9)
    image = Image.open(io.BytesIO(gif.data))
    assert image.format == "GIF" and image.n_frames == 9 and image.size == (64, 64)
    assert image.info["duration"] == 120  # 1000/8 ms rounded to GIF's 10 ms unit
    # The GIF shows the same frames as the MP4 (up to palette and H.264 losses).
    mp4_first = decoded_frames(videos["mp4"].artifacts[0].data)[0].astype(np.float32)
    assert np.abs(np.asarray(image.convert("RGB"), dtype=np.float32) - mp4_first).mean() < 12


def test_text2video_batch_runs_as_one_call_with_per_job_seeds(executor: LegacyCallExecutor) -> None:
    outcomes = run(executor, "tiny-wan", "text2video", job_ids=("job-a", "job-b"), num_frames=5)
    assert [o.error for o in outcomes] == [None, None]
    a, b = (o.result for o in outcomes if o.result is not None)
    assert a.report.batch_size == 2 and a.report.seeds == [7] and b.report.seeds == [107]
    assert a.artifacts[0].num_frames == b.artifacts[0].num_frames == 5
    assert a.artifacts[0].sha256 != b.artifacts[0].sha256


def test_unsupported_video_format_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    [outcome] = run(executor, "tiny-wan", "text2video", output=types_pb2.OutputOptions(format="png"))
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "output.format")


def test_image2video_depends_on_the_image(executor: LegacyCallExecutor) -> None:
    red = only_result(
        run(
            executor,
            "tiny-wan-i2v",
            "image2video",
            inputs=((IMAGE, png_bytes(Image.new("RGB", (80, 80), "red"))),),
        )
    )
    noisy = only_result(
        run(executor, "tiny-wan-i2v", "image2video", inputs=((IMAGE, png_bytes(noise_image(8))),))
    )
    [video] = red.artifacts
    assert (video.mime_type, video.num_frames, video.width, video.height) == ("video/mp4", 9, 64, 64)
    red_frames, noisy_frames = decoded_frames(video.data), decoded_frames(noisy.artifacts[0].data)
    assert len(red_frames) == 9 and red_frames[0].shape == (64, 64, 3)
    difference = np.abs(np.stack(red_frames).astype(np.float32) - np.stack(noisy_frames)).mean()
    assert difference > 2, "another input image must change the video"
    assert red.report.task is t.Task.IMAGE2VIDEO and red.report.pipeline_class == "WanImageToVideoPipeline"


def test_image2video_bad_image_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    [outcome] = run(
        executor, "tiny-wan-i2v", "image2video", inputs=((IMAGE, b"\x89PNG\r\n\x1a\n truncated"),)
    )
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[0]")


def test_a_strength_that_leaves_no_step_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    init = png_bytes(noise_image(9))
    [outcome] = run(executor, "tiny-sd", "image2image", inputs=((IMAGE, init),), strength=0.2)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "strength")
    assert "0 of 3 steps" in outcome.error.message


def test_a_video_size_the_model_cannot_make_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    [outcome] = run(executor, "tiny-wan", "text2video", width=72)
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "width")
    assert "multiple of 16" in outcome.error.message
