"""The continuous scenario's open loop: a seeded Poisson schedule, and what a run sums up to."""

from __future__ import annotations

import itertools
import statistics

from bench import continuous
from bench.continuous import Arrival, Outcome, Settings, schedule, summarize


def test_a_schedule_is_seeded_poisson_with_its_urgent_share() -> None:
    settings = Settings()
    arrivals = schedule(20.0, 4000, settings, seed=7)
    assert arrivals == schedule(20.0, 4000, settings, seed=7), "the same seed, the same schedule"
    assert arrivals != schedule(20.0, 4000, settings, seed=8)
    gaps = [b.at_s - a.at_s for a, b in itertools.pairwise(arrivals)]
    assert all(gap >= 0 for gap in gaps)
    assert abs(statistics.mean(gaps) - 1 / 20.0) < 0.005, "a rate of 20/s: gaps of 50 ms on average"
    # Exponential gaps: as many as the mean's share below it (1 - 1/e), not a fixed interval.
    assert abs(sum(g < 0.05 for g in gaps) / len(gaps) - 0.632) < 0.03
    assert {a.steps for a in arrivals} == set(settings.steps)
    urgent = sum(a.priority == settings.urgent_priority for a in arrivals) / len(arrivals)
    assert abs(urgent - settings.urgent_share) < 0.02
    assert {a.priority for a in arrivals} == {0, settings.urgent_priority}


def test_a_run_sums_up_latency_first_steps_throughput_and_calls() -> None:
    arrivals = [Arrival(i * 0.1, 4, 50 if i == 0 else 0, i) for i in range(4)]
    outcomes = [
        Outcome(arrivals[0], latency_s=0.2, first_step_s=0.05, jobs_in_call=1),
        Outcome(arrivals[1], latency_s=0.4, first_step_s=0.1, jobs_in_call=2),
        Outcome(arrivals[2], latency_s=0.6, first_step_s=None, jobs_in_call=2),
        Outcome(arrivals[3], failure="UNAVAILABLE"),
    ]
    summary = summarize(outcomes, wall_s=2.0, offered=5)
    assert (summary["offered"], summary["sent"], summary["done"]) == (5, 4, 3)
    assert summary["failures"] == {"UNAVAILABLE": 1} and summary["per_s"] == 1.5
    assert (summary["p50_ms"], summary["p99_ms"]) == (400.0, 600.0)
    assert (summary["first_step_p50_ms"], summary["first_step_p99_ms"]) == (50.0, 100.0)
    assert summary["urgent"] == 1 and summary["urgent_first_step_p50_ms"] == 50.0
    assert summary["mean_jobs_per_call"] == round(5 / 3, 2)


def test_the_quick_run_is_one_small_case_at_two_loads() -> None:
    quick = continuous.SCENARIO.quick
    assert quick.cases == (("tiny-sd", 64),) and quick.loads == (0.5, 1.3) and quick.jobs <= 32
    full = continuous.SCENARIO.full
    assert full.jobs >= 300 and full.loads == (0.5, 0.8, 1.0, 1.3)


def test_the_rows_hold_step_level_to_the_targets_against_whole() -> None:
    def run(p50: float, p99: float, per_s: float, urgent: float = 0.0) -> dict[str, float]:
        return {"p50_ms": p50, "p99_ms": p99, "per_s": per_s, "urgent_first_step_p50_ms": urgent}

    case = {
        "model": "tiny-sd",
        "size": 64,
        "step_ms": 10.0,
        "points": [
            {"load": 0.8, "whole": run(100, 1000, 10), "step": run(50, 500, 10)},
            {"load": 1.0, "whole": run(100, 1000, 10), "step": run(80, 500, 10)},
            {"load": 1.3, "whole": run(100, 1000, 10), "step": run(80, 500, 9, urgent=25)},
        ],
    }
    verdicts = {r["case"].split(": ", 1)[1]: (r["ratio"], r["verdict"]) for r in continuous.rows([case])}
    assert verdicts == {
        "p99, step vs whole": (0.5, "met"),
        "p50, step vs whole": (0.8, "missed"),
        "throughput, step vs whole": (0.9, "missed"),
        "urgent first step, in step times": (2.5, "missed"),
    }
