"""The pieces of the worker's stream around the protocol: a light import, backoff, the outbox.

The messages themselves are tested with their converter (tests/unit/sdk/test_protocol.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from omnirt.worker.connection import MAX_RESULT_ATTEMPTS, Outbox, backoff_delay


def test_importing_the_worker_package_stays_light() -> None:
    code = (
        "import sys, omnirt.worker, omnirt._internal.protocol.v1, omnirt.worker.main, omnirt.worker.daemon;"
        "heavy = [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("attempt", range(12))
def test_backoff_grows_is_capped_and_jittered(attempt: int) -> None:
    low = backoff_delay(attempt, cap_s=5.0, rand=lambda: 0.0)
    high = backoff_delay(attempt, cap_s=5.0, rand=lambda: 1.0)
    ceiling = min(5.0, 0.2 * 2**attempt)
    assert (low, high) == pytest.approx((ceiling / 2, ceiling))


def test_outbox_keeps_results_across_a_dropped_stream() -> None:
    async def scenario() -> None:
        box = Outbox()
        box.put("event-1")
        box.put("result-1", durable=True)
        first = await box.get()
        box.sent(first)
        result = await box.get()
        assert box.failed(result)  # the write failed: the result goes back to the front
        box.put("event-2")
        assert box.drop_live() == 1  # disconnected: the event is gone, the result is not
        assert box.durable_pending() == 1
        again = await box.get()
        assert again.message == "result-1"
        box.sent(again)
        await asyncio.wait_for(box.wait_idle(), 1)

    asyncio.run(scenario())


def test_outbox_gives_up_on_a_result_that_never_sends() -> None:
    async def scenario() -> None:
        box = Outbox()
        box.put("result", durable=True)
        for _ in range(MAX_RESULT_ATTEMPTS - 1):
            assert box.failed(await box.get())
        assert not box.failed(await box.get())
        assert box.durable_pending() == 0

    asyncio.run(scenario())


def test_a_runs_result_is_found_by_job_id_until_written() -> None:
    # A job offered again while its result waits is answered with that result, not run twice:
    # the worker finds it here through reconnects and failed writes, and no longer once written.
    async def scenario() -> None:
        box = Outbox()
        box.put("refusal-1", durable=True)  # a refusal: judged again if offered again
        box.put("result-1", job_id="job-1")
        assert box.waiting_result("job-1") == "result-1" and box.durable_pending() == 2
        assert box.waiting_result("job-2") is None
        refusal, result = await box.get(), await box.get()
        assert box.failed(result) and box.waiting_result("job-1") == "result-1"  # back in line
        box.sent(refusal)
        assert box.drop_live() == 0 and box.waiting_result("job-1") == "result-1"
        box.sent(await box.get())
        assert box.waiting_result("job-1") is None

    asyncio.run(scenario())


def test_outbox_hands_out_what_is_queued_together_within_the_limits() -> None:
    async def scenario() -> None:
        box = Outbox()
        for message in ("e1", "r1", "e2", "e3", "big", "e4"):
            box.put(message, durable=message.startswith("r"))
        size = {"big": 100}.get
        taken = await box.get_many(3, 50, lambda m: size(m, 1))
        assert [i.message for i in taken] == ["e1", "r1", "e2"]  # at most 3
        taken2 = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in taken2] == ["e3"]  # "big" would pass 50 bytes: it goes next
        alone = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in alone] == ["big"]  # first in line: taken whatever its size
        for item in (*taken, *taken2, *alone):
            box.sent(item)
        last = await box.get_many(10, 50, lambda m: size(m, 1))
        assert [i.message for i in last] == ["e4"]
        for item in reversed(last):
            box.failed(item)
        assert box.durable_pending() == 0  # an event whose write failed is not kept

    asyncio.run(scenario())


def test_outbox_puts_the_results_of_a_failed_batch_back_in_order() -> None:
    async def scenario() -> None:
        box = Outbox()
        for message in ("r1", "e1", "r2"):
            box.put(message, durable=message.startswith("r"))
        box.put("r3", durable=True)
        batch = await box.get_many(3, 1000, len)
        for item in reversed(batch):
            box.failed(item)
        again = await box.get_many(10, 1000, len)
        assert [i.message for i in again] == ["r1", "r2", "r3"]

    asyncio.run(scenario())
