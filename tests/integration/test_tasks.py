"""Each diffusers task through a real controller and worker: image2image, inpaint, t2v, i2v."""

from __future__ import annotations

import hashlib
import io

import av
import numpy as np
import pytest
from PIL import Image

import omnirt
from omnirt import errors
from omnirt.types import MediaKind, Task
from tests.daemons import Controller, Worker


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> omnirt.Client:
    with omnirt.Client(controller.address) as c:
        yield c  # type: ignore[misc]


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)


def mp4_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


RED = png_bytes(Image.new("RGB", (64, 64), "red"))
BLUE = png_bytes(Image.new("RGB", (64, 64), "blue"))


def test_image2image_with_the_sdk(client: omnirt.Client) -> None:
    common = {"model": "tiny-sd", "task": "image2image", "prompt": "a fox", "seed": 3, "timeout": 120}
    red = client.generate(image=RED, strength=0.3, **common)
    blue = client.generate(image=BLUE, strength=0.3, **common)
    [artifact] = red.artifacts
    assert artifact.mime_type == "image/png" and (artifact.width, artifact.height) == (64, 64)
    assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
    assert np.abs(rgb(artifact.data) - rgb(blue.artifacts[0].data)).mean() > 2, "the init image matters"
    report = red.report
    assert report.task is Task.IMAGE2IMAGE and report.pipeline_class == "StableDiffusionImg2ImgPipeline"
    assert report.config_resolved["strength"] == pytest.approx(0.3)
    # Without a strength the catalog's default (0.75) applies.
    assert client.validate(image=RED, **{k: v for k, v in common.items() if k != "timeout"}).config_resolved[
        "strength"
    ] == pytest.approx(0.75)


def test_inpaint_with_the_sdk_keeps_the_unmasked_half(client: omnirt.Client) -> None:
    source = np.random.RandomState(0).randint(0, 256, (64, 64, 3), dtype=np.uint8)
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (32, 0, 64, 64))
    result = client.generate(
        model="tiny-sd",
        task="inpaint",
        prompt="a fox",
        image=png_bytes(Image.fromarray(source)),
        mask=png_bytes(mask),
        strength=1.0,
        seed=4,
        timeout=120,
    )
    out = rgb(result.artifacts[0].data)
    assert np.abs(out[:, :32] - source[:, :32]).mean() < 1.0
    assert np.abs(out[:, 32:] - source[:, 32:]).mean() > 20.0
    assert result.report.pipeline_class == "StableDiffusionInpaintPipeline"


def test_text2video_with_the_sdk_returns_an_mp4(client: omnirt.Client) -> None:
    result = client.generate(model="tiny-wan", task="text2video", prompt="a boat at sea", seed=5, timeout=180)
    [video] = result.artifacts
    assert (video.kind, video.mime_type) == (MediaKind.VIDEO, "video/mp4")
    assert video.sha256 == hashlib.sha256(video.data).hexdigest()
    assert (video.width, video.height, video.num_frames, video.fps, video.duration_ms) == (
        64,
        64,
        9,
        8.0,
        1125,
    )
    frames = mp4_frames(video.data)
    assert len(frames) == 9 and frames[0].shape == (64, 64, 3)
    report = result.report
    assert report.task is Task.TEXT2VIDEO and report.pipeline_class == "WanPipeline"
    assert report.config_resolved["num_frames"] == 9 and report.config_resolved["fps"] == 8.0
    again = client.generate(model="tiny-wan", task="text2video", prompt="a boat at sea", seed=5, timeout=60)
    assert again.artifacts[0].sha256 == video.sha256, "same seed, same MP4"


def test_text2video_as_gif_with_the_sdk(client: omnirt.Client) -> None:
    result = client.generate(
        model="tiny-wan",
        task="text2video",
        prompt="a boat",
        num_frames=5,
        fps=10,
        output_format="gif",
        seed=6,
        timeout=120,
    )
    [gif] = result.artifacts
    assert gif.mime_type == "image/gif" and gif.num_frames == 5
    image = Image.open(io.BytesIO(gif.data))
    assert image.n_frames == 5 and image.size == (64, 64) and image.info["duration"] == 100


def test_image2video_with_the_sdk(client: omnirt.Client) -> None:
    result = client.generate(
        model="tiny-wan-i2v", task="image2video", prompt="a fox runs", image=RED, seed=7, timeout=180
    )
    [video] = result.artifacts
    assert video.mime_type == "video/mp4" and len(mp4_frames(video.data)) == video.num_frames == 9
    assert result.report.task is Task.IMAGE2VIDEO


def test_bad_image_bytes_fail_with_the_input_named_and_the_worker_serves_on(
    client: omnirt.Client, worker: Worker
) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(model="tiny-sd", task="image2image", prompt="x", image=b"not an image", timeout=60)
    assert info.value.field == "inputs[0]" and "not an image" in str(info.value)
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(
            model="tiny-sd",
            task="inpaint",
            prompt="x",
            image=RED,
            mask=png_bytes(Image.new("L", (32, 32), 255)),
            timeout=60,
        )
    assert info.value.field == "inputs[1]" and "same size" in str(info.value)
    assert worker.alive()
    assert client.generate(model="tiny-sd", task="image2image", prompt="x", image=RED, timeout=60).artifacts


def test_missing_inputs_are_refused_by_the_controller(client: omnirt.Client) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(model="tiny-sd", task="inpaint", prompt="x", image=RED)
    assert info.value.field == "inputs" and "mask" in str(info.value)
    with pytest.raises(errors.InvalidRequest) as info:
        client.validate(model="tiny-wan", task="text2video", prompt="x", output_format="png")
    assert info.value.field == "output.format"
