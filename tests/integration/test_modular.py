"""The modular mode through real daemons: a controller and `omnirt-worker --mode modular`."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import omnirt
from omnirt.types import EventKind, Task
from tests.daemons import Controller, Worker

MODEL = "tiny-sd-modular"


@pytest.fixture(scope="module")
def controller(log_dir: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir).start()  # the built-in catalog has tiny-sd-modular
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir, controller.address, "w-modular", model_dir, "--mode", "modular", "--models", MODEL
    )
    daemon.start()
    controller.wait_worker("w-modular")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), dtype=np.float32)


def test_a_repeated_prompt_hits_the_prompt_cache(client: omnirt.Client) -> None:
    job = client.submit(model=MODEL, prompt="a lighthouse, modular", seed=4)
    events = list(client.watch(job.id, timeout=120))
    first = client.get_job(job.id).result
    second = client.generate(model=MODEL, prompt="a lighthouse, modular", seed=5, timeout=60)
    assert first is not None and first.report is not None
    assert first.report.execution_mode == "modular"
    assert first.report.cache_hits == {"prompt_embeds": 0}
    assert second.report.cache_hits == {"prompt_embeds": 1}
    assert {"encode", "denoise", "decode", "export"} <= {timing.name for timing in second.report.timings}
    assert (second.report.timing("encode") or 0.0) < 5.0
    stages = [e.stage for e in events if e.kind is EventKind.STAGE and not e.stage_finished]
    assert [s for s in stages if s != "load"] == ["encode", "denoise", "decode", "export"]
    steps = [e.progress.step for e in events if e.kind is EventKind.PROGRESS and e.progress]
    assert steps == [1, 2, 3, 4]
    (a,), (b,) = first.artifacts, second.artifacts
    assert (a.width, a.height) == (64, 64) and a.data != b.data, "another seed, another image"


def test_image2image_works(client: omnirt.Client) -> None:
    common: dict[str, Any] = {
        "model": MODEL,
        "task": "image2image",
        "prompt": "a fox",
        "seed": 3,
        "timeout": 120,
    }
    red = client.generate(image=png_bytes(Image.new("RGB", (64, 64), "red")), strength=0.3, **common)
    blue = client.generate(image=png_bytes(Image.new("RGB", (64, 64), "blue")), strength=0.3, **common)
    assert red.report.task is Task.IMAGE2IMAGE and red.report.execution_mode == "modular"
    assert red.report.cache_hits == {"prompt_embeds": 0}
    assert blue.report.cache_hits == {"prompt_embeds": 1}
    assert np.abs(rgb(red.artifacts[0].data) - rgb(blue.artifacts[0].data)).mean() > 2, "the image matters"
    # strength 0.3 of 4 steps runs 1 step
    assert red.report.config_resolved["num_inference_steps"] == 1
