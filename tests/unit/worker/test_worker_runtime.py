"""Model cache, backends, export and the daemon's behaviour without a controller."""

from __future__ import annotations

import asyncio
import hashlib
import io
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from omnirt import types as t
from omnirt._internal.protocol.messages import Assignment, AssignmentItem
from omnirt.worker.config import WorkerConfig
from omnirt.worker.daemon import WorkerDaemon
from omnirt.worker.export import image as export
from omnirt.worker.export import video as video_export
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.model_cache import ModelCache, ModelLoadError
from omnirt.worker.runtime import backends

TINY = t.ModelSpec(id="tiny-sd", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline")
CPU = backends.Placement("cpu", "cpu", "float32")


def test_concurrent_first_requests_load_once(model_dir: Path) -> None:
    cache = ModelCache(model_dir)
    loads: list[int] = []
    got = []

    def request() -> None:
        got.append(cache.get(TINY, CPU, on_load_start=lambda: loads.append(1)))

    threads = [threading.Thread(target=request) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(loads) == 1
    assert sorted(c.cold for c in got) == [False, False, True]
    assert len({id(c.pipeline) for c in got}) == 1
    assert cache.loaded_models() == ["tiny-sd"]
    # Another catalog id on the same weights shares the entry and is reported too.
    alias = cache.get(
        t.ModelSpec(id="tiny-alias", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline"), CPU
    )
    assert not alias.cold and cache.loaded_models() == ["tiny-alias", "tiny-sd"]
    assert len(cache) == 1


def test_unknown_pipeline_class_is_a_load_error(model_dir: Path) -> None:
    spec = t.ModelSpec(id="odd", source="builtin:tiny-sd", pipeline_class="NoSuchPipeline")
    with pytest.raises(ModelLoadError, match=r"'odd'.*NoSuchPipeline"):
        ModelCache(model_dir).get(spec, CPU)


def test_placements() -> None:
    assert backends.placement_for("cpu", {"dtype": "float16"}) == CPU  # CPU always runs float32
    assert backends.placement_for("cuda") == backends.Placement("cuda", "cuda", "float16")
    assert backends.placement_for("cuda", {"dtype": "bf16"}).dtype == "bfloat16"
    assert backends.placement_for("ascend").device == "npu"
    with pytest.raises(backends.BackendError, match="dtype"):
        backends.placement_for("cuda", {"dtype": "int3"})
    assert backends.detect_backend("cpu") == "cpu"


def test_missing_accelerators_are_clear_errors() -> None:
    if not torch.cuda.is_available():
        with pytest.raises(backends.BackendError, match="CUDA"):
            backends.detect_backend("cuda")
        assert backends.detect_backend("auto") in ("cpu", "ascend")
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(backends.BackendError, match="torch_npu"):
            backends.detect_backend("ascend")


def test_image_export_is_deterministic_and_typed() -> None:
    image = Image.linear_gradient("L").convert("RGB").resize((32, 16))
    image.info["comment"] = "dropped"
    artifact = export.image_artifact(image, index=1, seed=9, job_id="j", fmt="png")
    again = export.image_artifact(image.copy(), index=1, seed=9, job_id="j", fmt="png")
    assert artifact.data == again.data
    assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
    assert (artifact.width, artifact.height, artifact.file_name) == (32, 16, "j-1.png")
    assert b"dropped" not in artifact.data
    webp = export.image_artifact(image, index=0, seed=9, job_id="j", fmt="webp", quality=80)
    assert (webp.mime_type, webp.file_name) == ("image/webp", "j-0.webp")
    assert Image.open(io.BytesIO(webp.data)).format == "WEBP"
    with pytest.raises(ValueError):
        export.image_format("tiff")


def test_png_export_is_lossless_and_as_small_as_pillows_default_on_a_photo_like_image() -> None:
    # Smooth shapes plus sensor-like noise, as diffusion models make. The export uses run-length
    # deflate (several times faster than Pillow's default level 6): it must lose no pixel and
    # make no bigger file here (a faster zlib level, or no compression, would).
    import numpy as np

    rng = np.random.default_rng(3)
    shapes = Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8))
    pixels = np.asarray(shapes.resize((256, 256), Image.Resampling.BICUBIC), dtype=np.float32)
    photo = Image.fromarray(np.clip(pixels + rng.normal(0, 4, pixels.shape), 0, 255).astype(np.uint8))
    data = export.encode_image(photo, "png")
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), np.asarray(photo))
    pillow_default = io.BytesIO()
    photo.save(pillow_default, format="PNG")
    assert len(data) <= 1.02 * len(pillow_default.getvalue())


def test_mp4_export_gives_the_same_bytes_every_time() -> None:
    # Blocky noise that made x264's AVX-512 code (which PyAV's x264 picks on an AVX-512 CPU)
    # encode into 3-4 different byte strings in 100 runs; encode_mp4 caps x264 at AVX2.
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (5, 8, 8, 3)).astype(np.float32)
    frames = np.repeat(np.repeat(blocks, 8, axis=1), 8, axis=2)
    frames = np.clip(frames + rng.normal(0, 12, frames.shape), 0, 255).astype(np.uint8)
    digests = {hashlib.sha256(video_export.encode_mp4(frames, 16.0)).hexdigest() for _ in range(200)}
    assert len(digests) == 1


def _unreachable_config(model_dir: Path, **overrides) -> WorkerConfig:
    # Port 1 on loopback refuses connections: the controller is "down".
    values = dict(controller="127.0.0.1:1", model_dir=str(model_dir), worker_id="w-d", reconnect_max_s=0.2)
    values.update(overrides)
    return WorkerConfig(**values)


def test_drain_with_the_controller_down_exits_zero(model_dir: Path, executor: LegacyCallExecutor) -> None:
    async def scenario() -> int:
        daemon = WorkerDaemon(_unreachable_config(model_dir), executor)
        runner = asyncio.create_task(daemon.run())
        await asyncio.sleep(0.5)  # a few reconnect attempts
        assert not daemon.connected
        daemon.request_drain("test")
        assert daemon.draining
        return await asyncio.wait_for(runner, 5)

    started = time.monotonic()
    assert asyncio.run(scenario()) == 0
    assert time.monotonic() - started < 5


def test_assignments_the_worker_cannot_take_are_answered(
    model_dir: Path, executor: LegacyCallExecutor
) -> None:
    def assignment(model_id: str, mode: str = "legacy_call") -> Assignment:
        spec = t.ModelSpec(id=model_id, execution_mode=mode, source="builtin:tiny-sd")
        return Assignment(
            "a-" + model_id, spec, [AssignmentItem("job-" + model_id, t.GenerateRequest(model_id))]
        )

    async def scenario() -> list:
        daemon = WorkerDaemon(_unreachable_config(model_dir, models=["tiny-sd"]), executor)
        daemon._handle(assignment("other"))
        daemon._handle(assignment("tiny-sd", mode="subprocess"))
        daemon.request_drain("test")
        daemon._handle(assignment("tiny-sd"))
        box = daemon._outbox
        return [(await box.get()).message.result for _ in range(box.durable_pending())]

    results = asyncio.run(scenario())
    assert [(r.job_id, r.error.code) for r in results] == [
        ("job-other", "FAILED_PRECONDITION"),
        ("job-tiny-sd", "FAILED_PRECONDITION"),
        ("job-tiny-sd", "UNAVAILABLE"),
    ]
    assert "does not serve model 'other'" in results[0].error.message
