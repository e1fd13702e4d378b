"""The peers scenario's rounds: systems take turns, rounds pool, ratios are medians of rounds."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import peers
from bench._load import LoadResult, merged


def test_merged_adds_calls_wall_time_latencies_and_failures() -> None:
    a = LoadResult(total=3, concurrency=4, wall_s=1.0, latencies_s=[0.1, 0.2])
    a.failures["UNAVAILABLE"] += 1
    b = LoadResult(total=2, concurrency=4, wall_s=0.5, latencies_s=[0.3, 0.4])
    both = merged([a, b])
    assert (both.total, both.concurrency, both.wall_s, both.ok) == (5, 4, 1.5, 4)
    assert both.failures == {"UNAVAILABLE": 1} and both.rate == 4 / 1.5


def test_systems_take_turns_and_each_round_starts_with_the_next_system() -> None:
    order: list[str] = []

    def system(name: str) -> Any:
        async def call(i: int) -> None:
            order.append(name)

        return call

    systems = {name: system(name) for name in ("a", "b", "c")}
    [point] = asyncio.run(peers._load_points(systems, (1,), calls=30, rounds=3))
    timed = order[3 * 3 :]  # after each system's 3 warm-up calls
    turns = [timed[i] for i in range(0, len(timed), 10)]  # 10 calls per system and round
    assert turns == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for name in systems:
        assert point[name]["total"] == 30 and point[name]["ok"] == 30
        assert len(point[name]["rounds_per_s"]) == 3


def test_a_throughput_ratio_is_the_median_of_the_rounds_ratios() -> None:
    point = {
        "ours": {"rounds_per_s": [300.0, 90.0, 330.0]},  # round 2: a burst of load from elsewhere
        "ray": {"rounds_per_s": [100.0, 100.0, 100.0]},
        "ray_batch": {"rounds_per_s": [50.0, 100.0, 110.0]},
    }
    # Per round over the better of Ray's two: 3.0, 0.9, 3.0 -> median 3.0 (the mean rates give 2.4).
    assert peers._round_ratio(point, "ours", ["ray", "ray_batch"]) == 3.0
    stalled = {"ours": {"rounds_per_s": [5.0]}, "ray": {"rounds_per_s": [0.0]}}
    assert peers._round_ratio(stalled, "ours", ["ray"]) is None
