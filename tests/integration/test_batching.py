"""Dynamic batching through real daemons: compatible jobs share one pipeline call."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import omnirt
from tests.daemons import Controller, RedisServer, Worker

PROMPTS = ["a red fox", "a blue boat", "a green hill", "a yellow moon"]


@dataclass
class Batching:
    """Where the tests send requests: `back` holds the worker, `front` (the same one in memory) none."""

    back: Controller
    front: Controller


@pytest.fixture(scope="module", params=["memory", "redis"])
def batching(request: pytest.FixtureRequest, log_dir: Path, model_dir: Path) -> Iterator[Batching]:
    """One controller in memory; on Redis two controllers, the worker on one of them, so half of the
    jobs of a batch come in through the controller without workers."""
    flags = ("--batch-window-ms", "400", "--max-batch-size", "4")
    redis = RedisServer(log_dir).start() if request.param == "redis" else None
    store = ("--store", redis.url) if redis else ()
    back = Controller(log_dir, *flags, *store).start()
    front = Controller(log_dir, *flags, *store).start() if redis else back
    worker = Worker(log_dir, back.address, "w-batch", model_dir, "--slots", "1").start()
    try:
        back.wait_worker("w-batch")
        yield Batching(back, front)
    finally:
        worker.stop()
        for controller in {back, front}:
            controller.stop()
        if redis:
            redis.stop()


def pixels(result: omnirt.GenerateResult) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(result.artifacts[0].data)).convert("RGB"), dtype=np.int16)


def test_four_compatible_requests_run_as_one_call_and_match_unbatched_runs(batching: Batching) -> None:
    with omnirt.Client(batching.back.address) as client, omnirt.Client(batching.front.address) as front:
        client.generate(model="tiny-sd", prompt="warm up", seed=0, timeout=120)
        # One at a time: each is alone in the queue, so each runs unbatched (batch_size 1)...
        alone = [
            client.generate(model="tiny-sd", prompt=p, seed=10 + i, timeout=60) for i, p in enumerate(PROMPTS)
        ]
        assert all(r.report.batch_size == 1 and not r.report.batch_group_id for r in alone)
        # ...and the same four at once: they arrive within the window and share one call.
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(
                    (front if i % 2 else client).generate, model="tiny-sd", prompt=p, seed=10 + i, timeout=60
                )
                for i, p in enumerate(PROMPTS)
            ]
            batched = [f.result() for f in futures]
    reports = [r.report for r in batched]
    assert {r.batch_size for r in reports} == {4}
    assert len({r.batch_group_id for r in reports}) == 1 and reports[0].batch_group_id
    assert len({r.timing("denoise") for r in reports}) == 1, "one pipeline call: one denoise stage"
    assert [r.seeds for r in reports] == [[10], [11], [12], [13]], "seeds stay per request"
    # Tolerance: float32 matmuls over a batch of 4 and a batch of 1 accumulate in a different
    # order on the CPU, so latents differ by float rounding (~1e-6 relative); after 4 steps and
    # the VAE decode that is at most a couple of units in an 8-bit pixel, never a visible change.
    for one, many in zip(alone, batched, strict=True):
        diff = np.abs(pixels(one) - pixels(many))
        assert diff.max() <= 3 and diff.mean() < 0.5, (diff.max(), diff.mean())
    # Different seeds give different images inside the batch too.
    assert not np.array_equal(pixels(batched[0]), pixels(batched[1]))


def test_incompatible_requests_do_not_share_a_call(batching: Batching) -> None:
    with omnirt.Client(batching.front.address) as client, ThreadPoolExecutor(2) as pool:
        a = pool.submit(
            client.generate, model="tiny-sd", prompt="a", seed=1, num_inference_steps=3, timeout=60
        )
        b = pool.submit(
            client.generate, model="tiny-sd", prompt="b", seed=2, num_inference_steps=4, timeout=60
        )
        ra, rb = a.result().report, b.result().report
    assert ra.batch_size == 1 and rb.batch_size == 1
