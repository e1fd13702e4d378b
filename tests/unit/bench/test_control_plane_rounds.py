"""bench.control_plane's rounds: plain and secure take turns going first; ratios per round."""

from __future__ import annotations

from typing import Any

from bench import control_plane as cp


async def _nothing(i: int) -> None:
    return None


def _systems(*names: str) -> list[cp.System]:
    return [cp.System(name, {}, _nothing) for name in names]


def test_plain_and_secure_swap_places_every_round_and_the_groups_keep_their_order() -> None:
    groups = [
        _systems("omnirt", "omnirt_secure"),
        _systems("omnirt_http", "omnirt_secure_http"),
        _systems("echo"),
    ]
    orders = [[s.name for s in cp.round_order(groups, i)] for i in range(3)]
    assert orders[0] == ["omnirt", "omnirt_secure", "omnirt_http", "omnirt_secure_http", "echo"]
    assert orders[1] == ["omnirt_secure", "omnirt", "omnirt_secure_http", "omnirt_http", "echo"]
    assert orders[2] == orders[0]


def test_without_secure_the_order_is_the_one_it_always_was() -> None:
    groups = [_systems("omnirt"), _systems("omnirt_http"), _systems("echo")]
    for i in range(2):
        assert [s.name for s in cp.round_order(groups, i)] == ["omnirt", "omnirt_http", "echo"]


def _load(per_s: float, p50_ms: float) -> dict[str, Any]:
    return {"per_s": per_s, "p50_ms": p50_ms, "p99_ms": 2 * p50_ms}


def test_secure_ratios_are_over_the_plain_stack_of_the_same_round() -> None:
    numbers = {
        "omnirt": _load(1000.0, 40.0),
        "omnirt_secure": _load(900.0, 44.0),
        "omnirt_http": _load(1200.0, 30.0),
        "omnirt_secure_http": _load(1080.0, 33.0),
        "echo": _load(2000.0, 20.0),
    }
    ratios = cp.round_ratios(numbers)
    assert ratios["secure_ratio"] == 0.9 and ratios["secure_p50_ratio"] == 1.1
    assert ratios["secure_http_ratio"] == 0.9
    assert ratios["throughput_ratio"] == 0.5 and ratios["http_throughput_ratio"] == 0.6
    plain_only = cp.round_ratios({k: numbers[k] for k in ("omnirt", "echo")})
    assert set(plain_only) == {"throughput_ratio", "p50_latency_ratio"}
    stalled = cp.round_ratios({**numbers, "omnirt": _load(0.0, 0.0)})
    assert stalled["secure_ratio"] == 0.0  # a plain round with no call done: no ratio, no crash


def test_medians_are_of_the_rounds_ratios() -> None:
    rounds: list[dict[str, Any]] = [
        {"omnirt": _load(p, 40.0), "omnirt_secure": _load(s, 44.0), "echo": _load(2000.0, 20.0)}
        for p, s in ((1000.0, 950.0), (500.0, 1000.0), (900.0, 800.0))  # round 2: a burst elsewhere
    ]
    for r in rounds:
        r |= cp.round_ratios(r)
    median = cp._medians(rounds)
    # Of 0.95, 2.0 and 0.889; the median rates (950 / 900) would say secure is faster than plain.
    assert median["secure_ratio"] == 0.95
    assert median["omnirt_per_s"] == 900.0 and median["omnirt_secure_per_s"] == 950.0
    assert "omnirt_http_per_s" not in median
