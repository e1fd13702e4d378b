"""Runtime options through a real controller and worker: per model and per request (`extra.runtime`),
the model cache budget and LoRA adapters."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import omnirt
from omnirt import errors
from omnirt.worker.tiny.lora import build_tiny_lora
from omnirt.worker.tiny.registry import ensure_builtin
from tests.daemons import Controller, Worker, wait_for

# Fits tiny-sd (about 4.4 MB) or tiny-wan (about 0.44 MB), not both.
ONE_MODEL_BUDGET = "4600000"


@pytest.fixture(scope="module")
def lora(model_dir: Path) -> Path:
    """A tiny LoRA for tiny-sd under the worker's model dir (an allowed adapter folder)."""
    from diffusers import StableDiffusionPipeline

    pipeline = StableDiffusionPipeline.from_pretrained(ensure_builtin("tiny-sd", model_dir))
    return build_tiny_lora(pipeline, model_dir / "loras" / "fox", seed=1)


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory, lora: Path) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "adapters.toml"
    catalog.write_text(
        f"""
[[models]]
id = "tiny-sd-fox"
tasks = ["text2image"]
execution_mode = "legacy_call"
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
[models.runtime]
adapters = {{ fox = "{lora}" }}

[[models]]
id = "tiny-sd-lowmem"
tasks = ["text2image"]
execution_mode = "legacy_call"
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
[models.runtime]
enable_vae_slicing = true
enable_vae_tiling = true
cpu_offload = true
"""
    )
    # A batch window, so that concurrent compatible requests share a pipeline call.
    daemon = Controller(
        log_dir, "--catalog", str(catalog), "--batch-window-ms", "400", "--max-batch-size", "4"
    ).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(
        log_dir,
        controller.address,
        "w-options",
        model_dir,
        "--models",
        "tiny-sd,tiny-wan,tiny-sd-fox,tiny-sd-lowmem",
        "--model-cache-bytes",
        ONE_MODEL_BUDGET,
    ).start()
    controller.wait_worker("w-options")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address) as c:
        yield c


def pixels(result: omnirt.GenerateResult) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(result.artifacts[0].data)), dtype=np.float32)


def test_adapters_by_path_and_by_catalog_name(client: omnirt.Client, lora: Path) -> None:
    common = {"prompt": "a fox in the snow", "seed": 9, "num_inference_steps": 2, "timeout": 120}
    plain = client.generate(model="tiny-sd", **common)
    by_path = client.generate(model="tiny-sd", adapters=[omnirt.Adapter("loras/fox", 1.0)], **common)
    plain_again = client.generate(model="tiny-sd", **common)
    assert np.abs(pixels(by_path) - pixels(plain)).max() > 10
    assert plain_again.artifacts[0].data == plain.artifacts[0].data, "an adapter leaked into a later request"
    [used] = by_path.report.config_resolved["adapters"]
    assert used["name"] == "loras/fox" and used["path"] == str(lora.resolve())

    by_name = client.generate(model="tiny-sd-fox", adapters=["fox"], **common)
    assert np.abs(pixels(by_name) - pixels(by_path)).max() <= 1.0


def test_an_adapter_outside_the_allowed_folders_is_invalid_argument(client: omnirt.Client) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        client.generate(model="tiny-sd", prompt="x", adapters=["/etc"], timeout=60)
    assert caught.value.field == "adapters[0]", caught.value
    assert client.generate(model="tiny-sd", prompt="x", seed=1, timeout=60).artifacts  # still serving


def test_a_one_model_budget_evicts_and_reloads(client: omnirt.Client, controller: Controller) -> None:
    sd = client.generate(model="tiny-sd", prompt="a fox", seed=1, timeout=120)
    wan = client.generate(
        model="tiny-wan", task="text2video", prompt="a boat", seed=1, num_frames=5, timeout=180
    )
    sd_again = client.generate(model="tiny-sd", prompt="a fox", seed=1, timeout=120)
    assert wan.report.cold_start and sd_again.report.cold_start
    assert any("evicted" in w and "tiny-sd" in w for w in wan.report.warnings)
    assert any("evicted" in w and "tiny-wan" in w for w in sd_again.report.warnings)
    assert sd_again.artifacts[0].data == sd.artifacts[0].data

    def controller_sees_only_tiny_sd() -> bool:  # loaded models travel with the next heartbeat
        [info] = [w for w in controller.workers() if w.id == "w-options"]
        return list(info.loaded_models) == ["tiny-sd"]

    wait_for(controller_sees_only_tiny_sd, 10, "the controller to see tiny-wan evicted")


def test_runtime_options_of_a_catalog_entry_are_applied_and_reported(client: omnirt.Client) -> None:
    result = client.generate(model="tiny-sd-lowmem", prompt="a fox", seed=2, timeout=120)
    report = result.report
    assert report.config_resolved["runtime_options"] == {
        "enable_vae_slicing": True,
        "enable_vae_tiling": True,
    }
    assert any("cpu_offload ignored" in w for w in report.warnings)
    plain = client.generate(model="tiny-sd", prompt="a fox", seed=2, num_inference_steps=2, timeout=120)
    assert np.abs(pixels(result) - pixels(plain)).max() <= 2.0


def test_request_runtime_options_run_and_are_reported(client: omnirt.Client) -> None:
    common = {"task": "text2video", "prompt": "a boat", "seed": 4, "num_inference_steps": 8, "timeout": 180}
    plain = client.generate(model="tiny-wan", **common)
    runtime = {"step_cache": {"kind": "first_block", "threshold": 0.2}}
    cached = client.generate(model="tiny-wan", extra={"runtime": runtime}, **common)
    report = cached.report
    assert report.config_resolved["runtime_options"] == {"step_cache": runtime["step_cache"]}
    assert report.cache_hits["step_cache"] > 0 and not report.cold_start
    assert plain.report.cache_hits == {} and "runtime_options" not in plain.report.config_resolved


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        ({"vae_tiling": True}, "extra.runtime.vae_tiling"),
        ({"enable_vae_tiling": "on"}, "extra.runtime.enable_vae_tiling"),
        ({"step_cache": {"kind": "first_block", "threshold": "low"}}, "extra.runtime.step_cache.threshold"),
    ],
)
def test_bad_request_runtime_options_are_invalid_argument(
    client: omnirt.Client, runtime: dict, field: str
) -> None:
    with pytest.raises(errors.InvalidRequest) as caught:
        client.generate(model="tiny-sd", prompt="x", extra={"runtime": runtime}, timeout=60)
    assert caught.value.field == field, caught.value


def test_a_step_cache_on_a_unet_model_is_refused_before_it_is_queued(client: omnirt.Client) -> None:
    # The family table says SD's UNet takes no cache hooks: the controller refuses it (the
    # worker's own refusal, by the loaded denoiser's class, is tested in the worker's unit tests).
    runtime = {"step_cache": "first_block"}
    before = len(client.list_jobs())
    with pytest.raises(
        errors.InvalidRequest, match="sd family's denoiser takes no diffusers cache hooks"
    ) as caught:
        client.generate(model="tiny-sd", prompt="x", extra={"runtime": runtime}, timeout=60)
    assert caught.value.field == "extra.runtime.step_cache"
    assert len(client.list_jobs()) == before, "no job was made"
    assert client.generate(model="tiny-sd", prompt="x", seed=1, timeout=60).artifacts  # still serving


def test_requests_with_different_runtime_options_never_share_a_batch(client: omnirt.Client) -> None:
    client.generate(model="tiny-sd", prompt="warm up", seed=0, timeout=120)
    sliced = {"runtime": {"enable_vae_slicing": True}}
    asks = [("a red fox", sliced), ("a blue boat", {}), ("a green hill", sliced), ("a yellow moon", {})]
    with ThreadPoolExecutor(len(asks)) as pool:
        futures = [
            pool.submit(client.generate, model="tiny-sd", prompt=p, seed=i, extra=extra, timeout=120)
            for i, (p, extra) in enumerate(asks)
        ]
        reports = [f.result().report for f in futures]
    groups: dict[str, set[bool]] = {}
    for (_, extra), report in zip(asks, reports, strict=True):
        asked = bool(extra)
        assert ("runtime_options" in report.config_resolved) == asked
        if report.batch_group_id:
            groups.setdefault(report.batch_group_id, set()).add(asked)
    assert all(len(kinds) == 1 for kinds in groups.values()), groups  # never mixed
    # Arriving within one batch window, the requests with equal options did share calls.
    assert sorted(r.batch_size for r in reports) == [2, 2, 2, 2], [r.batch_size for r in reports]
