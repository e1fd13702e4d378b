"""persistent_worker through real daemons: a controller and `omnirt-worker --mode persistent_worker`
serving the built-in `tiny-sd-cfg2` (tiny-sd on a resident 2-rank torchrun group)."""

from __future__ import annotations

import io
import os
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
    # No --preload flag: it is on by default in this mode.
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


def loaded(controller: Controller) -> list[str]:
    """What the worker's last Hello or heartbeat said it holds warm."""
    return [m for w in controller.workers() if w.id == "w-pw" for m in w.loaded_models]


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
        if "omnirt.worker.modes.persistent.rank" in argv and str(model_dir) in argv and state != "Z":
            pids.append(int(proc.name))
    return pids


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def rank_pid(model_dir: Path, rank: int) -> int:
    """The pid of rank `rank` of the group (torchrun sets RANK in each rank's environment)."""
    for pid in group_pids(model_dir):
        if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            return pid
    raise AssertionError(f"no rank {rank} runs")


def reference(model_dir: Path) -> np.ndarray:
    """What StableDiffusionPipeline makes in this process for the test's request."""
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
    return np.asarray(expected.convert("RGB")).astype(int)


def test_the_group_starts_with_the_worker_and_the_first_request_is_warm(
    controller: Controller, pw_worker: Worker, model_dir: Path
) -> None:
    # The worker connects before its group is ready (the start takes seconds): not reported warm...
    assert "tiny-sd-cfg2" not in loaded(controller)
    # ...until the group is up, without any request asking for it.
    wait_for(lambda: "tiny-sd-cfg2" in loaded(controller), 120, "the preloaded group to be reported warm")
    assert len(group_pids(model_dir)) == 3, "the torchrun agent and two ranks run before any request"
    with omnirt.Client(controller.address) as client:
        first = client.generate(
            model="tiny-sd-cfg2", prompt=PROMPT, negative_prompt="fog", seed=42, timeout=60
        )
        second = client.generate(
            model="tiny-sd-cfg2", prompt=PROMPT, negative_prompt="fog", seed=42, timeout=60
        )
        (worker,) = [w for w in client.list_workers() if w.id == "w-pw"]
    r1, r2 = first.report, second.report
    assert (r1.execution_mode, r1.worker_id) == ("persistent_worker", "w-pw")
    assert r1.cold_start is False and r1.timing("load") is None, "the first user must not pay the start"
    assert r2.cold_start is False and r2.timing("load") is None
    assert r1.config_resolved["nproc_per_node"] == 2 and r1.config_resolved["cfg_parallel"] is True
    assert first.artifacts[0].data == second.artifacts[0].data
    assert worker.execution_mode == "persistent_worker" and "tiny-sd-cfg2" in worker.loaded_models
    diff = np.abs(pixels(first.artifacts[0].data) - reference(model_dir)).max()
    assert diff <= MAX_PIXEL_DIFF, f"differs from tiny-sd's pipeline by {diff}/255"


def test_a_killed_rank_restarts_the_group_and_the_next_request_is_cold(
    controller: Controller, pw_worker: Worker, model_dir: Path
) -> None:
    before = group_pids(model_dir)
    os.kill(rank_pid(model_dir, 1), signal.SIGKILL)
    with omnirt.Client(controller.address) as client:
        # It waits for the restart (or, sent before the worker noticed, fails UNAVAILABLE on the
        # broken group and is retried by the controller): either way it pays the start.
        result = client.generate(
            model="tiny-sd-cfg2", prompt=PROMPT, negative_prompt="fog", seed=42, timeout=180
        )
    assert result.report.cold_start is True and (result.report.timing("load") or 0) > 0
    assert np.abs(pixels(result.artifacts[0].data) - reference(model_dir)).max() <= MAX_PIXEL_DIFF
    assert pw_worker.alive(), "a dead rank never takes the worker down"
    after = group_pids(model_dir)
    assert len(after) == 3 and set(after).isdisjoint(before)
    wait_for(lambda: "tiny-sd-cfg2" in loaded(controller), 15, "the restarted group to be reported warm")


def test_worker_sigterm_leaves_no_rank_process(pw_worker: Worker, model_dir: Path) -> None:
    pids = group_pids(model_dir)
    assert len(pids) == 3, "the torchrun agent and two ranks run while the worker serves"
    pw_worker.signal(signal.SIGTERM)
    assert pw_worker.wait(30) == 0
    wait_for(lambda: not group_pids(model_dir), 10, "the group's processes to exit")


def test_a_killed_worker_leaves_no_rank_process(
    controller: Controller, log_dir: Path, model_dir: Path
) -> None:
    """SIGKILL gives the worker no chance to stop its group: the parent-death signal does."""
    daemon = Worker(
        log_dir,
        controller.address,
        "w-pw-kill",
        model_dir,
        "--mode",
        "persistent_worker",
        "--models",
        "tiny-sd-cfg2",
    ).start()
    try:
        wait_for(lambda: len(group_pids(model_dir)) == 3, 120, "the preloaded group to start")
        pids = group_pids(model_dir)
        daemon.signal(signal.SIGKILL)
        daemon.wait(10)
        wait_for(lambda: not group_pids(model_dir), 30, f"the group's processes {pids} to exit")
    finally:
        daemon.stop()
