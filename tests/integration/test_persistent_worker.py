"""persistent_worker through real daemons: a controller and `omnirt-worker --mode persistent_worker`
serving the built-in `tiny-sd-cfg2` (tiny-sd on a resident 2-rank torchrun group)."""

from __future__ import annotations

import io
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import omnirt
from tests.daemons import Controller, Worker, wait_for

PROMPT = "a lighthouse at dusk"
# Guidance split across ranks runs the UNet on batches of 1 instead of one batch of 2: float
# rounding, amplified by 4 steps and the VAE, may move a pixel by a uint8 step (see the unit tests).
MAX_PIXEL_DIFF = 2


@pytest.fixture(scope="module")
def pw_worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-pw",
        model_dir,
        "--mode",
        "persistent_worker",
        "--models",
        "tiny-sd-cfg2",
    ).start()
    controller.wait_worker("w-pw")
    yield daemon
    daemon.stop()


def group_pids(model_dir: Path) -> list[int]:
    """The torchrun agent and ranks serving models from `model_dir` (their argv names it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if "omnirt.worker.persistent.rank" in argv and str(model_dir) in argv and state != "Z":
            pids.append(int(proc.name))
    return pids


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def test_cold_then_warm_and_the_same_image_as_tiny_sd(
    controller: Controller, pw_worker: Worker, model_dir: Path
) -> None:
    with omnirt.Client(controller.address) as client:
        cold = client.generate(
            model="tiny-sd-cfg2", prompt=PROMPT, negative_prompt="fog", seed=42, timeout=180
        )
        warm = client.generate(
            model="tiny-sd-cfg2", prompt=PROMPT, negative_prompt="fog", seed=42, timeout=60
        )
    # loaded_models travels with the worker's heartbeats (one a second): wait for the next one
    wait_for(
        lambda: any(w.id == "w-pw" and "tiny-sd-cfg2" in w.loaded_models for w in controller.workers()),
        15,
        "the heartbeat to report tiny-sd-cfg2 loaded",
    )
    with omnirt.Client(controller.address) as client:
        (worker,) = [w for w in client.list_workers() if w.id == "w-pw"]
    r1, r2 = cold.report, warm.report
    assert (r1.execution_mode, r1.worker_id) == ("persistent_worker", "w-pw")
    assert r1.cold_start is True and (r1.timing("load") or 0) > 0
    assert r2.cold_start is False and r2.timing("load") is None
    assert r2.execution_ms < r1.execution_ms, "the warm request must not pay the group start"
    assert r1.config_resolved["nproc_per_node"] == 2 and r1.config_resolved["cfg_parallel"] is True
    assert cold.artifacts[0].data == warm.artifacts[0].data
    assert worker.execution_mode == "persistent_worker" and "tiny-sd-cfg2" in worker.loaded_models

    import diffusers
    import torch

    pipe = diffusers.StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"))
    pipe.set_progress_bar_config(disable=True)
    expected = pipe(
        prompt=PROMPT,
        negative_prompt="fog",
        num_inference_steps=4,
        guidance_scale=7.5,
        width=64,
        height=64,
        generator=[torch.Generator("cpu").manual_seed(42)],
    ).images[0]
    diff = np.abs(pixels(cold.artifacts[0].data) - np.asarray(expected.convert("RGB")).astype(int)).max()
    assert diff <= MAX_PIXEL_DIFF, f"differs from tiny-sd's pipeline by {diff}/255"


def test_worker_sigterm_leaves_no_rank_process(pw_worker: Worker, model_dir: Path) -> None:
    pids = group_pids(model_dir)
    assert len(pids) == 3, "the torchrun agent and two ranks run while the worker serves"
    pw_worker.signal(signal.SIGTERM)
    assert pw_worker.wait(30) == 0
    wait_for(lambda: not group_pids(model_dir), 10, "the group's processes to exit")
