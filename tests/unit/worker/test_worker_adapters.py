"""LoRA adapters per request on tiny-sd: applied, scaled, never leaked, and kept inside allowed folders."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.runtime import adapters, backends
from omnirt.worker.tiny.lora import build_tiny_lora

TINY_SD = t.ModelSpec(id="tiny-sd", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline")
CPU = backends.Placement("cpu", "cpu", "float32")


def tiny_sd(model_dir: Path) -> object:
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(model_dir / "tiny-sd")


@pytest.fixture(scope="module")
def lora(model_dir: Path) -> Path:
    """A tiny LoRA for tiny-sd in `model_dir/loras/fox` (an allowed folder)."""
    return build_tiny_lora(tiny_sd(model_dir), model_dir / "loras" / "fox", seed=1)


@pytest.fixture(scope="module")
def lora_executor(model_dir: Path) -> LegacyCallExecutor:
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-lora", torch_threads=1))


def run(
    executor: LegacyCallExecutor,
    *requests: list[tuple[str, float]],
    runtime: dict | None = None,
    seed: int = 5,
) -> list[ItemOutcome]:
    """One assignment of tiny-sd text2image jobs, job i with adapters `requests[i]`, all with `seed`."""
    spec = models_pb2.ModelSpec(
        id="tiny-sd",
        source="builtin:tiny-sd",
        pipeline_class="StableDiffusionPipeline",
        execution_mode="legacy_call",
        tasks=[types_pb2.TASK_TEXT2IMAGE],
    )
    if runtime:
        spec.runtime.update(runtime)
    msg = gateway_pb2.Assignment(assignment_id="as-lora", model=spec)
    for index, wanted in enumerate(requests):
        request = types_pb2.GenerateRequest(
            task=types_pb2.TASK_TEXT2IMAGE,
            model="tiny-sd",
            prompt="a fox in the snow",
            width=64,
            height=64,
            num_inference_steps=2,
            guidance_scale=5.0,
            seed=seed,
        )
        for name, scale in wanted:
            request.adapters.add(name=name, scale=scale)
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    return outcomes


def pixels(outcome: ItemOutcome) -> np.ndarray:
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return np.asarray(Image.open(io.BytesIO(outcome.result.artifacts[0].data)), dtype=np.float32)


def test_an_adapter_changes_the_image_and_does_not_leak(
    lora_executor: LegacyCallExecutor, lora: Path
) -> None:
    [plain] = run(lora_executor, [])
    [with_lora] = run(lora_executor, [("loras/fox", 1.0)])
    [plain_again] = run(lora_executor, [])
    assert np.abs(pixels(with_lora) - pixels(plain)).max() > 10, "the adapter must change the image"
    assert np.array_equal(pixels(plain_again), pixels(plain)), "the adapter leaked into the next request"
    assert with_lora.result is not None and with_lora.result.report is not None
    [used] = with_lora.result.report.config_resolved["adapters"]
    assert used["name"] == "loras/fox" and used["scale"] == 1.0 and used["path"] == str(lora.resolve())


def test_scale_zero_is_like_no_adapter(lora_executor: LegacyCallExecutor, lora: Path) -> None:
    [plain] = run(lora_executor, [])
    [zero] = run(lora_executor, [("loras/fox", 0.0)])
    assert np.abs(pixels(zero) - pixels(plain)).max() <= 1.0


def test_a_batch_with_different_adapters_runs_them_apart(
    lora_executor: LegacyCallExecutor, lora: Path
) -> None:
    [plain] = run(lora_executor, [])
    [with_lora] = run(lora_executor, [("loras/fox", 1.0)])
    mixed = run(lora_executor, [], [("loras/fox", 1.0)])
    assert np.array_equal(pixels(mixed[0]), pixels(plain))
    assert np.abs(pixels(mixed[1]) - pixels(with_lora)).max() <= 1.0


def test_catalog_adapter_names_and_the_loaded_lru(
    lora_executor: LegacyCallExecutor, lora: Path, tmp_path: Path
) -> None:
    # A catalog-level name may point anywhere the operator chose (here: outside model_dir).
    wolf = build_tiny_lora(tiny_sd(Path(lora_executor.config.model_dir)), tmp_path / "wolf", seed=2)
    runtime = {"adapters": {"wolf": str(wolf)}, "max_loaded_adapters": 1}
    [by_name] = run(lora_executor, [("wolf", 0.8)], runtime=runtime)
    [fox] = run(lora_executor, [("loras/fox", 1.0)], runtime=runtime)
    pixels(by_name), pixels(fox)
    assert by_name.result is not None and by_name.result.report is not None
    assert by_name.result.report.config_resolved["adapters"][0]["name"] == "wolf"
    cached = lora_executor.cache.get(TINY_SD, CPU)
    lora_executor.cache.release(cached)
    assert adapters.loaded_adapters(cached.pipeline) == [str(lora.resolve())]  # wolf was unloaded


def test_adapter_dirs_allow_another_folder(
    lora_executor: LegacyCallExecutor, lora: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "shared-loras"
    outside.mkdir()
    os.symlink(lora, outside / "fox-link")  # a link whose target is in an allowed folder is fine
    [refused] = run(lora_executor, [("fox-link", 1.0)])
    assert refused.error is not None and refused.error.field == "adapters[0]"  # not an allowed folder yet
    [ok] = run(lora_executor, [("fox-link", 1.0)], runtime={"adapter_dirs": [str(outside)]})
    pixels(ok)


@pytest.mark.parametrize(
    "name",
    [
        "loras/../../etc",  # '..'
        "/etc",  # absolute, elsewhere
        "no-such-adapter",  # neither a catalog name nor a path
        "escape-link",  # a symlink inside model_dir pointing out of it
        "",
    ],
)
def test_escapes_and_missing_adapters_are_invalid_argument(
    lora_executor: LegacyCallExecutor, lora: Path, name: str
) -> None:
    link = Path(lora_executor.config.model_dir) / "escape-link"
    if not link.exists():
        os.symlink("/etc", link)
    [bad, good] = run(lora_executor, [("loras/fox", 1.0), (name, 1.0)], [])
    assert bad.error is not None and bad.error.code == "INVALID_ARGUMENT"
    assert bad.error.field == "adapters[1]", bad.error
    pixels(good)  # the worker keeps serving the rest of the batch


def test_a_file_that_is_not_a_lora_is_invalid_argument(lora_executor: LegacyCallExecutor, lora: Path) -> None:
    junk = Path(lora_executor.config.model_dir) / "loras" / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    [bad] = run(lora_executor, [("loras/junk.safetensors", 1.0)])
    assert bad.error is not None and bad.error.code == "INVALID_ARGUMENT" and bad.error.field == "adapters[0]"
    [plain] = run(lora_executor, [])
    pixels(plain)


def test_calls_of_one_adapter_set_share_the_pipeline_and_never_starve_another_set() -> None:
    """The lock of a pipeline's adapters: one set's calls hold it together; a call of another set
    waits for them, and meanwhile a newcomer of the set in use waits behind it."""
    import threading
    import time

    lock = adapters._AdapterLock()  # the policy alone, without a pipeline
    order: list[str] = []
    log = threading.Lock()

    def call(name: str, key: tuple[str, ...], hold_s: float, started: threading.Event | None = None) -> None:
        with lock.hold(
            key, setup=lambda: order.append(f"setup {key[0]}"), teardown=lambda: order.append(f"off {key[0]}")
        ):
            with log:
                order.append(f"in {name}")
            if started is not None:
                started.set()
            time.sleep(hold_s)

    first_in = threading.Event()
    first = threading.Thread(target=call, args=("a1", ("a",), 0.3, first_in))
    first.start()
    assert first_in.wait(5)
    shared = threading.Thread(target=call, args=("a2", ("a",), 0.0))
    shared.start()
    shared.join(5)
    assert order == ["setup a", "in a1", "in a2"], "one set's calls hold it together"
    other = threading.Thread(target=call, args=("b1", ("b",), 0.0))
    other.start()
    time.sleep(0.05)  # b1 waits for a1
    late = threading.Thread(target=call, args=("a3", ("a",), 0.0))
    late.start()
    for thread in (first, other, late):
        thread.join(5)
    assert order[3:] == ["off a", "setup b", "in b1", "off b", "setup a", "in a3", "off a"], order
