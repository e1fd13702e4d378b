"""The built-in catalog's modular and persistent_worker ids, each run once under its own id through
real daemons: a controller, one `--mode modular` worker (tiny-sdxl-modular, tiny-flux-modular)
and one `--mode persistent_worker` worker (tiny-sd3-cfg2, tiny-sd3-dp2, tiny-wan-cfg2,
tiny-wan-ulysses2: a resident 2-rank group each). Each test asserts what its id promises: the
mode in the report, the parallel layout in `config_resolved`, the output's shape. The modes'
own behaviour (outputs equal to one process, batching, caches) is tested in test_modular.py,
test_persistent_worker.py and the unit tests of the modes.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import pytest
from PIL import Image

import omnirt
from tests.daemons import Controller, Worker

MODULAR = ("tiny-sdxl-modular", "tiny-flux-modular")
PERSISTENT = ("tiny-sd3-cfg2", "tiny-sd3-dp2", "tiny-wan-cfg2", "tiny-wan-ulysses2")
STEPS = 2  # the fewest that show a guidance split: step 1 runs whole, step 2 split


@pytest.fixture(scope="module")
def workers(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[None]:
    from omnirt.worker.tiny.registry import ensure_builtin

    modular = Worker(
        log_dir, controller.address, "w-ids-modular", model_dir, "--mode", "modular",
        "--models", ",".join(MODULAR),
    )  # fmt: skip
    persistent = Worker(
        log_dir, controller.address, "w-ids-pw", model_dir, "--mode", "persistent_worker",
        "--models", ",".join(PERSISTENT),
    )  # fmt: skip
    daemons = [modular.start()]
    try:
        # The persistent groups start at once (preload, this mode's default) while the modular
        # tests run. Their weights are built here first: the worker builds a missing one in its
        # preload thread, and two first imports of diffusers' pipeline classes in two threads at
        # once fail (a preload of tiny-wan-cfg2 beside tiny-wan-ulysses2 does), which would
        # leave that group to start on its first job, alone, some 15 s later.
        for name in ("tiny-sd3", "tiny-wan"):
            ensure_builtin(name, model_dir)
        daemons.append(persistent.start())
        controller.wait_workers({"w-ids-modular", "w-ids-pw"})
        yield
    finally:
        # Both drain at once (a persistent group takes seconds to wind down).
        for daemon in daemons:
            if daemon.alive():
                daemon.signal(signal.SIGTERM)
        for daemon in daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(30)
            daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, workers: None) -> Iterator[omnirt.Client]:
    with controller.client() as c:
        yield c


def generate(client: omnirt.Client, model: str, **fields: Any) -> omnirt.GenerateResult:
    result = client.generate(
        model=model, prompt="a red fox", seed=7, num_inference_steps=STEPS, timeout=240, **fields
    )
    assert result.report.model == model
    return result


def image_size(artifact: omnirt.Artifact) -> tuple[int, int]:
    image = Image.open(io.BytesIO(artifact.data))
    assert image.format == "PNG"
    return image.size


def video_frames(artifact: omnirt.Artifact) -> tuple[int, tuple[int, int]]:
    """The MP4's frame count and frame size, decoded."""
    with av.open(io.BytesIO(artifact.data)) as container:
        frames = [frame.to_image() for frame in container.decode(video=0)]
    return len(frames), frames[0].size


@pytest.mark.parametrize(
    ("model", "blocks"),
    [("tiny-sdxl-modular", "StableDiffusionXLAutoBlocks"), ("tiny-flux-modular", "FluxAutoBlocks")],
)
def test_a_modular_id_runs_on_the_families_blocks(client: omnirt.Client, model: str, blocks: str) -> None:
    result = generate(client, model)
    report = result.report
    assert (report.execution_mode, report.worker_id) == ("modular", "w-ids-modular")
    assert report.config_resolved["modular_blocks"] == blocks
    assert report.config_resolved["num_inference_steps"] == STEPS
    [artifact] = result.artifacts
    assert image_size(artifact) == (64, 64)


def persistent(report: omnirt.RunReport, parallel: str) -> dict[str, Any]:
    """The run's `config_resolved`, checked to be a 2-rank group's `parallel` pipeline call."""
    assert (report.execution_mode, report.worker_id) == ("persistent_worker", "w-ids-pw")
    config = report.config_resolved
    assert (config["program"], config["parallel"], config["nproc_per_node"]) == ("pipeline", parallel, 2)
    return config


def test_tiny_sd3_cfg2_halves_batched_guidance_across_two_ranks(client: omnirt.Client) -> None:
    result = generate(client, "tiny-sd3-cfg2")
    config = persistent(result.report, "cfg")
    assert config["cfg_parallel"] is True
    # Step 1 whole (2 samples) on each rank, then one half each: 3 of the unsplit 4 samples.
    assert [(r["pattern"], r["computed_samples"]) for r in config["guidance_split"]] == [("batched", 3)] * 2
    assert image_size(result.artifacts[0]) == (64, 64)


def test_tiny_sd3_dp2_gives_each_rank_one_of_two_outputs(client: omnirt.Client) -> None:
    result = generate(client, "tiny-sd3-dp2", num_outputs=2)
    config = persistent(result.report, "data")
    assert config["outputs_per_rank"] == [1, 1] and result.report.seeds == [7, 8]
    assert [image_size(a) for a in result.artifacts] == [(64, 64)] * 2
    assert result.artifacts[0].data != result.artifacts[1].data, "two seeds, two images"


def test_tiny_wan_cfg2_gives_each_rank_one_of_the_two_guidance_calls(client: omnirt.Client) -> None:
    result = generate(client, "tiny-wan-cfg2")
    config = persistent(result.report, "cfg")
    assert config["cfg_parallel"] is True
    # Step 1: both calls on each rank; step 2: one each (3 of the unsplit 4 calls).
    assert [(r["pattern"], r["computed_calls"]) for r in config["guidance_split"]] == [("sequential", 3)] * 2
    assert video_frames(result.artifacts[0]) == (9, (64, 64))


def test_tiny_wan_ulysses2_splits_the_tokens_across_two_ranks(client: omnirt.Client) -> None:
    result = generate(client, "tiny-wan-ulysses2")
    config = persistent(result.report, "ulysses")
    assert "guidance_split" not in config
    # 9 frames: 3 latent frames of 8x8 in (1, 2, 2) patches, 48 tokens: each rank's attention 24.
    assert config["context_parallel"] == [{"tokens": 24}] * 2
    assert video_frames(result.artifacts[0]) == (9, (64, 64))
