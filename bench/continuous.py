"""Continuous load: open-loop arrivals (seeded Poisson), mixed step counts, a tenth of them urgent.

Requests do not wait for each other: each arrives at its own time, drawn from a seeded Poisson
process (exponential gaps), whatever the ones before it are doing, as a service's users arrive.
The closed loops of the other scenarios cannot show what queueing does to latency.

Per model and size (tiny-sd at 64x64 and 256x256, tiny-flux at 64x64), one deployment per mode
side by side, each one controller and one `omnirt-worker --slots 1`:

* `none`: no batching (`--max-batch-size 1`, `--no-step-engine`): one request per pipeline call;
* `whole`: whole-request batching, the default (requests with the same call fields that wait in
  the queue when the worker frees up share one call; a different step count is another call),
  without the step engine, as before it;
* `step`: step-level scheduling (issue 30): the default batching, with the worker's step engine:
  a compatible request (and the queued ones that share its call) joins the batch the worker runs
  at the next step, beside the worker's one slot (its rows), and leaves it at its own last step.

First the capacity of `whole` is measured with a closed loop (`capacity_concurrency` callers, the
same request mix). Then, for each offered load (a fraction of that capacity), the same seeded
arrival schedule (`jobs` requests) is sent to each mode in turn: `num_inference_steps` drawn
from `steps`, `urgent_share` of the requests at priority `urgent_priority`. Per mode and load:
p50/p99 of the end-to-end latency (submit to result) and of the time to first step (submit to
the first PROGRESS event, by the event's own time), throughput (jobs done over the time from the
first arrival to the last result), the mean jobs per pipeline call (each RunReport's batch size),
the step engine's mean rows per forward (`config_resolved.step_engine.mean_rows`) and the urgent
jobs' time to first step. A step's time is measured alone in the warm-up (denoise over steps of
a 20-step request).

* `ray`: Ray Serve's `@serve.batch` at the same offered load (issue 30), where Ray Serve is
  installed (`bash bench/ray/setup.sh`, as for `peers`): the `/sd-batch` app of
  bench/ray/serve_app.py (tiny-sd, `max_batch_size` 8 like OmniRT's, no batch wait, one call per
  batch, one batch at a time, the workers' torch threads), started once per scenario, after every
  OmniRT point is done and OmniRT's daemons are stopped (its idle processes take about a seventh
  of a core: no system runs beside another's). The same schedules go to it over HTTP (aiohttp,
  one POST per arrival; size and steps come with each request). It serves tiny-sd only
  (tiny-flux: n/a) and has no priorities (the urgent requests go like the others; their latency
  is reported); first step (no progress events) and jobs per call (not in its answer) are n/a.
  `@serve.batch` has no grouping key: a batch takes the queued requests whatever their steps,
  and the app makes one pipeline call per size/steps/guidance group of it. Without Ray the
  other modes run and the result says Ray was skipped; `--quick` leaves Ray out (its start
  takes longer than the quick points) unless `python -m bench.continuous --quick --ray`.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from typing import Any

import omnirt

from . import _ray
from . import _scenario as sc
from ._http import post_json, session
from ._load import drive, failure_name
from ._ray import RayServe
from ._stacks import Stack, start_stack
from ._stats import percentile

NAME = "continuous"
TITLE = "Continuous: open-loop Poisson arrivals, mixed steps, urgent jobs; step-level, whole-request, none"
PROMPT = "a red fox in the snow"
# mode -> (controller flags, worker flags). The baselines run without the step engine (as
# before it); `step` is whole-request batching with the worker's step engine: a queued request
# joins the running batch at the next step, with the queued requests that share its call.
MODES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "none": (("--max-batch-size", "1"), ("--slots", "1", "--no-step-engine")),
    "whole": ((), ("--slots", "1", "--no-step-engine")),
    "step": ((), ("--slots", "1")),
}
# Ray Serve's `@serve.batch` (bench/ray/serve_app.py's /sd-batch): a mode of its own, not a
# deployment of OmniRT, for the models that app serves.
RAY = "ray"
RAY_MODELS = ("tiny-sd",)
RAY_MAX_BATCH = 8  # OmniRT's default --max-batch-size
GUIDANCE = 7.5  # what OmniRT's tiny-sd uses when a request leaves it out, as these do


@dataclass(frozen=True)
class Arrival:
    """One request of a schedule: when it arrives (s after the start) and what it asks."""

    at_s: float
    steps: int
    priority: int
    seed: int


@dataclass(frozen=True)
class Settings:
    """Counts of the continuous scenario; the defaults are the full run."""

    # (model, size): the families of issue 30's figure that run as tiny twins here.
    cases: tuple[tuple[str, int], ...] = (("tiny-sd", 64), ("tiny-sd", 256), ("tiny-flux", 64))
    loads: tuple[float, ...] = (0.5, 0.8, 1.0, 1.3)  # offered load, fractions of `whole`'s capacity
    jobs: int = 300  # requests per (case, load, mode)
    large_jobs: int = 100  # at 256x256, where a request takes ~10x longer
    steps: tuple[int, ...] = (4, 8, 20)
    urgent_share: float = 0.1
    urgent_priority: int = 50
    capacity_jobs: int = 96  # closed-loop requests measuring `whole`'s capacity
    capacity_concurrency: int = 16
    seed: int = 30
    max_point_s: float = 300.0  # no new arrival after this, per (case, load, mode)
    ray: bool = True  # Ray Serve's @serve.batch too, on the tiny-sd cases, where it is installed

    @classmethod
    def quick(cls) -> Settings:
        return replace(
            cls(),
            cases=(("tiny-sd", 64),),
            loads=(0.5, 1.3),
            jobs=24,
            large_jobs=8,
            capacity_jobs=16,
            ray=False,  # Ray takes ~40 s to start on 2 cores, most of a quick run: `--ray` asks
        )


def schedule(rate_per_s: float, jobs: int, settings: Settings, seed: int) -> list[Arrival]:
    """`jobs` arrivals of a Poisson process of `rate_per_s` (exponential gaps), seeded."""
    rng = random.Random(seed)
    at, out = 0.0, []
    for i in range(jobs):
        at += rng.expovariate(rate_per_s)
        urgent = rng.random() < settings.urgent_share
        out.append(
            Arrival(round(at, 4), rng.choice(settings.steps), settings.urgent_priority if urgent else 0, i)
        )
    return out


def request_of(model: str, size: int, arrival: Arrival) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": PROMPT,
        "width": size,
        "height": size,
        "num_inference_steps": arrival.steps,
        "priority": arrival.priority,
        "seed": arrival.seed,
    }


async def warm(address: str, model: str, size: int, settings: Settings) -> float:
    """One untimed request per step count (the model loads; each count's first call is made);
    returns a step's time alone (ms: the denoise stage of a 20-step request over its steps)."""
    async with omnirt.AsyncClient(address) as client:
        for steps in settings.steps:
            await client.generate(**request_of(model, size, Arrival(0.0, steps, 0, steps)), timeout=600)
        alone = await client.generate(**request_of(model, size, Arrival(0.0, 20, 0, 1)), timeout=600)
    return (alone.report.timing("denoise") or 0.0) / 20


async def capacity(address: str, model: str, size: int, settings: Settings) -> float:
    """Requests per second of a closed loop of the mixed workload (after a warm-up)."""
    mix = schedule(1.0, settings.capacity_jobs, settings, settings.seed)  # only its steps are used
    async with omnirt.AsyncClient(address) as client:

        async def call(i: int) -> None:
            await client.generate(**request_of(model, size, replace(mix[i], priority=0)), timeout=600)

        await drive(call, min(len(mix), settings.capacity_concurrency), settings.capacity_concurrency, 600)
        result = await drive(call, len(mix), settings.capacity_concurrency, 600)
    return result.rate


@dataclass
class Outcome:
    """What one request of an open-loop run saw (seconds after its submission)."""

    arrival: Arrival
    latency_s: float = 0.0
    first_step_s: float | None = None
    jobs_in_call: int = 1
    rows_per_step: float = 0.0  # the step engine's mean rows per forward for this job (0: not used)
    failure: str = ""


async def open_loop(
    address: str, model: str, size: int, arrivals: list[Arrival], max_s: float
) -> dict[str, Any]:
    """Send each request at its arrival time, whatever the others do; follow each to its end."""
    outcomes: list[Outcome] = []
    async with omnirt.AsyncClient(address) as client:

        async def one(arrival: Arrival) -> None:
            outcome = Outcome(arrival)
            outcomes.append(outcome)
            submitted = time.time()
            firsts: list[float] = []

            def seen(event: omnirt.JobEvent) -> None:
                if event.kind is omnirt.EventKind.PROGRESS and not firsts and event.time is not None:
                    firsts.append(event.time.timestamp() - submitted)

            try:
                job = await client.submit(**request_of(model, size, arrival), timeout=60)
                result = await client.wait(job.id, timeout=600, on_event=seen)
            except Exception as exc:
                outcome.failure = failure_name(exc)
                return
            outcome.latency_s = time.time() - submitted
            outcome.first_step_s = firsts[0] if firsts else None
            if result.report is not None:
                outcome.jobs_in_call = max(1, result.report.batch_size)
                shared = result.report.config_resolved.get("step_engine") or {}
                outcome.rows_per_step = float(shared.get("mean_rows") or 0.0)

        wall_s = await paced(arrivals, max_s, one)
    return summarize(outcomes, wall_s, len(arrivals))


async def paced(
    arrivals: list[Arrival], max_s: float, one: Callable[[Arrival], Coroutine[Any, Any, None]]
) -> float:
    """Start `one(arrival)` at each arrival's time, whatever the others do; the seconds from the
    start to the last one's end."""
    started = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    for arrival in arrivals:
        if arrival.at_s > max_s:
            break
        delay = started + arrival.at_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(arrival)))
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


def ray_body(size: int, arrival: Arrival) -> dict[str, Any]:
    """The /sd-batch request of an arrival (no priority: Ray has none)."""
    body = {"prompt": PROMPT, "seed": arrival.seed, "steps": arrival.steps, "guidance": GUIDANCE}
    return {**body, "width": size, "height": size}


# What Ray does not tell: no progress events (first step), no batch size in its answer.
RAY_UNSEEN = {f"{u}first_step_{p}_ms" for u in ("", "urgent_") for p in ("p50", "p99")} | {
    "mean_jobs_per_call",
    "mean_rows_per_step",
}


async def ray_open_loop(url: str, size: int, arrivals: list[Arrival], max_s: float) -> dict[str, Any]:
    """The open loop of `open_loop`, to Ray's /sd-batch over HTTP: one POST per arrival."""
    outcomes: list[Outcome] = []
    async with session() as http:

        async def one(arrival: Arrival) -> None:
            outcome = Outcome(arrival)
            outcomes.append(outcome)
            submitted = time.perf_counter()
            try:
                await post_json(http, url, ray_body(size, arrival))
            except Exception as exc:
                outcome.failure = failure_name(exc)
                return
            outcome.latency_s = time.perf_counter() - submitted

        wall_s = await paced(arrivals, max_s, one)
    summary = summarize(outcomes, wall_s, len(arrivals))
    return {k: v for k, v in summary.items() if k not in RAY_UNSEEN}


def summarize(outcomes: list[Outcome], wall_s: float, offered: int) -> dict[str, Any]:
    done = [o for o in outcomes if not o.failure]
    urgent = [o for o in done if o.arrival.priority]
    firsts = [o.first_step_s for o in done if o.first_step_s is not None]
    urgent_firsts = [o.first_step_s for o in urgent if o.first_step_s is not None]
    failures: dict[str, int] = {}
    for o in outcomes:
        if o.failure:
            failures[o.failure] = failures.get(o.failure, 0) + 1
    return {
        "offered": offered,
        "sent": len(outcomes),
        "done": len(done),
        "failures": failures,
        "wall_s": round(wall_s, 2),
        "per_s": round(len(done) / wall_s, 2) if wall_s else 0.0,
        "p50_ms": sc.ms(percentile([o.latency_s for o in done], 50)),
        "p99_ms": sc.ms(percentile([o.latency_s for o in done], 99)),
        "first_step_p50_ms": sc.ms(percentile(firsts, 50)),
        "first_step_p99_ms": sc.ms(percentile(firsts, 99)),
        "urgent": len(urgent),
        "urgent_p50_ms": sc.ms(percentile([o.latency_s for o in urgent], 50)),
        "urgent_p99_ms": sc.ms(percentile([o.latency_s for o in urgent], 99)),
        "urgent_first_step_p50_ms": sc.ms(percentile(urgent_firsts, 50)),
        "urgent_first_step_p99_ms": sc.ms(percentile(urgent_firsts, 99)),
        "mean_jobs_per_call": round(sum(o.jobs_in_call for o in done) / len(done), 2) if done else 0.0,
        "mean_rows_per_step": round(sum(o.rows_per_step for o in done) / len(done), 2) if done else 0.0,
    }


def start_modes(
    ctx: sc.Context,
    models: list[str],
    modes: tuple[str, ...] = tuple(MODES),
    controller_args: tuple[str, ...] = (),
    worker_args: tuple[str, ...] = (),
) -> dict[str, Stack]:
    """One deployment per OmniRT mode, side by side: a controller and one one-slot worker each."""
    stacks: dict[str, Stack] = {}
    try:
        for mode in (m for m in modes if m in MODES):  # `ray` is not OmniRT's
            flags, worker_flags = MODES[mode]
            worker = ["--models", ",".join(models), *worker_flags, *worker_args]
            stacks[mode] = start_stack(ctx, f"continuous-{mode}", [worker], (*flags, *controller_args))
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    return stacks


def launch_ray(
    settings: Settings, ctx: sc.Context, modes: tuple[str, ...]
) -> tuple[RayServe | None, dict[str, Any]]:
    """Ray Serve started (not yet ready) where asked for and installed, else None; and Ray's part
    of the result: its status (ok, off, skipped, later failed) and why."""
    if RAY not in modes:
        return None, {"status": "off", "reason": "not among this run's modes"}
    if not any(model in RAY_MODELS for model, _ in settings.cases):
        return None, {"status": "off", "reason": "no tiny-sd case (Ray's app serves only tiny-sd)"}
    quick = "`--quick` leaves it out; `python -m bench.continuous --quick --ray` adds it"
    return _ray.launch(
        ctx.log_dir, ctx.model_dir / "tiny-sd", ctx.torch_threads, RAY_MAX_BATCH, settings.ray or quick
    )


def run_ray(
    settings: Settings,
    ctx: sc.Context,
    modes: tuple[str, ...],
    cases: list[dict[str, Any]],
    schedules: list[list[list[Arrival]]],
) -> dict[str, Any]:
    """Ray Serve's points, added to `cases` (the arrivals of each case's loads in `schedules`);
    returns Ray's part of the result: its status (ok, off, skipped, later failed) and why."""
    ray, ray_state = launch_ray(settings, ctx, modes)
    if ray is None:
        if RAY in modes:
            print(f"   ray: {ray_state['status']}: {ray_state['reason']}", flush=True)
        return ray_state
    try:
        ray = _ray.ready(ray, ray_state)
        for case, sent in zip(cases, schedules, strict=True):
            if ray is None or case["model"] not in RAY_MODELS:
                continue
            url, size = f"{ray.url}/sd-batch", case["size"]
            try:
                warm_up = [ray_body(size, Arrival(0.0, steps, 0, steps)) for steps in settings.steps]
                asyncio.run(_ray.post_each(url, warm_up))  # as `warm` does for OmniRT
            except Exception as exc:
                _ray.drop(ray, ray_state, exc, f"warm-up at {size}x{size} failed")
                ray = None
                continue
            for point, arrivals in zip(case["points"], sent, strict=True):
                point[RAY] = asyncio.run(ray_open_loop(url, size, arrivals, settings.max_point_s))
    finally:
        if ray is not None:
            ray.stop()
    return ray_state


def run(
    settings: Settings,
    ctx: sc.Context,
    modes: tuple[str, ...] = (*MODES, RAY),
    controller_args: tuple[str, ...] = (),
    worker_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Every case at every load, in each of `modes` (`whole` among them: the loads are fractions
    of its capacity); `controller_args` and `worker_args` go to every OmniRT deployment
    (bench.gpu's). `ray` runs on the tiny-sd cases where `settings.ray` and Ray is installed."""
    models = sorted({model for model, _ in settings.cases})
    stacks: dict[str, Stack] = {}
    cases = []
    schedules: list[list[list[Arrival]]] = []  # per case, per load: the arrivals sent
    try:
        stacks = start_modes(ctx, models, modes, controller_args, worker_args)
        for index, (model, size) in enumerate(settings.cases):
            step_ms = 0.0
            for mode, stack in stacks.items():  # the model warm in every mode before anything is timed
                alone_ms = asyncio.run(warm(stack.address, model, size, settings))
                step_ms = alone_ms if mode == "whole" else step_ms
            whole = asyncio.run(capacity(stacks["whole"].address, model, size, settings))
            jobs = settings.large_jobs if size > 64 else settings.jobs
            points, sent = [], []
            for load in settings.loads:
                arrivals = schedule(
                    load * whole, jobs, settings, settings.seed + 1000 * index + int(load * 100)
                )
                sent.append(arrivals)
                point: dict[str, Any] = {"load": load, "rate_per_s": round(load * whole, 3)}
                for mode, stack in stacks.items():
                    point[mode] = asyncio.run(
                        open_loop(stack.address, model, size, arrivals, settings.max_point_s)
                    )
                points.append(point)
            schedules.append(sent)
            cases.append(
                {
                    "model": model,
                    "size": size,
                    "capacity_per_s": round(whole, 3),
                    "step_ms": round(step_ms, 2),
                    "points": points,
                }
            )
    finally:
        for stack in stacks.values():
            stack.stop()
    # Ray Serve last, alone on the machine as each OmniRT mode was (its idle processes take about
    # a seventh of a core): the same schedules, on the tiny-sd cases.
    ray_state = run_ray(settings, ctx, modes, cases, schedules)
    return {
        "settings": sc.settings_dict(settings),
        "ray": ray_state,
        "cases": cases,
        "rows": rows(cases, ray_state),
    }


# Issue 30's targets, step-level against whole-request batching in one run: (load, what, the
# most (or, for throughput, the least) the ratio may be).
TARGETS = (
    (0.8, "p99_ms", 0.6),
    (1.0, "p50_ms", 0.7),
    (1.3, "per_s", 1.0),
)
LABELS = {"p99_ms": "p99", "p50_ms": "p50", "per_s": "throughput"}
HEADER: tuple[str, ...] = ("load", "mode", "done", "throughput", "p50", "p99", "urgent p50", "first step p50")
HEADER += ("first step p99", "urgent first step p50", "jobs per call", "rows per step")


def _shown(what: str, value: float) -> str:
    return sc.fmt_rate(value) if what == "per_s" else sc.fmt_ms(value)


def rows(cases: list[dict[str, Any]], ray: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The suite's rows: step against whole at the targets' loads (and against Ray's
    `@serve.batch` there, without a target), the urgent first step, Ray's skip or failure."""
    out = []
    for case in cases:
        name = f"{case['model']} {case['size']}px"
        for point in case["points"]:
            whole, step = point["whole"], point.get("step")
            if step is None:
                continue
            for load, what, bound in TARGETS:
                if abs(point["load"] - load) > 1e-6:
                    continue
                label = LABELS[what]
                ratio = sc.ratio(step[what], whole[what])
                op = ">=" if what == "per_s" else "<="
                out.append(
                    sc.Row(
                        NAME,
                        f"{name}, {load:.0%} load: {label}, step vs whole",
                        f"step {label} {_shown(what, step[what])}",
                        f"whole {label} {_shown(what, whole[what])}",
                        ratio,
                        f"{op} {bound}",
                        "met" if sc.verdict(ratio, op, bound) == "met" else "missed",
                    ).as_dict()
                )
                if RAY in point:
                    out.append(
                        sc.Row(
                            NAME,
                            f"{name}, {load:.0%} load: {label}, step vs Ray @serve.batch",
                            f"step {label} {_shown(what, step[what])}",
                            f"Ray @serve.batch {label} {_shown(what, point[RAY][what])}",
                            sc.ratio(step[what], point[RAY][what]),
                        ).as_dict()
                    )
            if abs(point["load"] - max(p["load"] for p in case["points"])) < 1e-6 and case.get("step_ms"):
                urgent = step["urgent_first_step_p50_ms"]
                ratio = sc.ratio(urgent, case["step_ms"])
                out.append(
                    sc.Row(
                        NAME,
                        f"{name}, {point['load']:.0%} load: urgent first step, in step times",
                        f"step urgent first step p50 {sc.fmt_ms(urgent)}",
                        f"one step alone {sc.fmt_ms(case['step_ms'])}",
                        ratio,
                        "<= 2",
                        "met" if ratio is not None and ratio <= 2 else "missed",
                    ).as_dict()
                )
    if ray is not None and ray["status"] in ("skipped", "failed"):
        out.append(sc.Row(NAME, "Ray Serve @serve.batch", f"{ray['status']}: {ray['reason']}").as_dict())
    return out


def _cells(mode: str, m: dict[str, Any] | None) -> list[str]:
    """A mode's cells after load and mode; n/a where it has no number (Ray's unseen ones, or no
    run at all: Ray on a model its app does not serve)."""
    if m is None:
        return ["n/a"] * 10

    def ms(key: str) -> str:
        return sc.fmt_ms(m[key]) if key in m else "n/a"

    failed = f" ({sum(m['failures'].values())} failed)" if m["failures"] else ""
    return [
        f"{m['done']}/{m['offered']}{failed}",
        sc.fmt_rate(m["per_s"]),
        ms("p50_ms"),
        ms("p99_ms"),
        ms("urgent_p50_ms") if m.get("urgent") else "",
        ms("first_step_p50_ms"),
        ms("first_step_p99_ms"),
        ms("urgent_first_step_p50_ms"),
        f"{m['mean_jobs_per_call']:.2f}" if "mean_jobs_per_call" in m else "n/a",
        f"{m.get('mean_rows_per_step', 0.0):.2f}" if mode == "step" else "",
    ]


def _ray_note(ray: dict[str, Any] | None) -> str:
    if ray is None:  # results from before the `ray` mode
        return "Ray Serve's `@serve.batch` at the same load did not run here."
    if ray["status"] != "ok":
        return f"Ray Serve's `@serve.batch` (mode **ray**) did not run: {ray['status']}, {ray['reason']}."
    return (
        f"**ray**: Ray Serve {ray['version']}'s `@serve.batch` (the `/sd-batch` application of "
        f"`bench/ray/serve_app.py`: tiny-sd, `max_batch_size` {ray.get('max_batch_size', RAY_MAX_BATCH)}, no "
        "batch wait, one batch at a time, the workers' torch threads; "
        "started once every OmniRT point is done and its daemons stopped, so that no system runs "
        f"beside another's idle processes; ready {ray['ready_s']} s after its start) gets the same "
        "schedules, "
        "over HTTP (aiohttp, one POST per arrival). Its app serves only tiny-sd "
        "(n/a for other models). Ray has no priorities: its urgent requests go like the others. It sends "
        "no progress and its answer does not say how many requests shared the call: first step and "
        "jobs per call are n/a. `@serve.batch` has no grouping key: a batch takes the queued "
        "requests whatever their step counts, so the app makes one pipeline call per step count of "
        "the batch, in turn (as OmniRT's whole-request batching makes one call per step count), and "
        "answers every request of the batch when the whole batch is done, as Ray does."
    )


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    ray = result.get("ray")
    ray_ran = ray is not None and ray["status"] == "ok"
    parts = [
        "One deployment per mode side by side, each one controller and one `omnirt-worker --slots 1`: "
        "**none** `--max-batch-size 1 --no-step-engine`, **whole** the default whole-request batching "
        "(`--no-step-engine`), **step** step-level scheduling (the default batching and the worker's step "
        "engine: a request, with the queued ones that share its call, joins the running batch at the "
        "next step, beside the slot). Arrivals are a "
        f"seeded Poisson process at a fraction of **whole**'s capacity (a closed loop of "
        f"{s['capacity_concurrency']} callers, {s['capacity_jobs']} requests); the same schedule of "
        f"{s['jobs']} requests ({s['large_jobs']} at 256x256) goes to each mode, `num_inference_steps` "
        f"drawn from {s['steps']}, {s['urgent_share']:.0%} at priority {s['urgent_priority']}. Latency "
        "is submit to result (urgent p50: the urgent requests'); the first step is submit to the first "
        "PROGRESS event (its own time).",
        _ray_note(ray),
    ]
    if result.get("separate_run"):  # merged into the page's results from a run of its own
        parts.append(f"Recorded apart from the rest of this page, with `{result['separate_run']}`.")
    for case in result["cases"]:
        rows_md = []
        for point in case["points"]:
            for mode in (*MODES, RAY):
                if mode in point or (mode == RAY and ray_ran):
                    load = f"{point['load']:.0%} ({point['rate_per_s']:.2f}/s)"
                    rows_md.append([load, mode, *_cells(mode, point.get(mode))])
        step_ms = f"; one step alone {case['step_ms']:.1f} ms" if case.get("step_ms") else ""
        parts.append(
            f"**{case['model']} {case['size']}x{case['size']}**: capacity of **whole** "
            f"{case['capacity_per_s']:.2f} requests/s{step_ms}."
        )
        parts.append(sc.md_table(HEADER, rows_md, right=2))
    parts.append(
        "Rows per step: the step engine's mean rows per denoiser forward over each job's forwards (a "
        "row is an output, doubled by guidance)."
    )
    return "\n\n".join(parts)


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.continuous [--ray] [bench.suite's options]`: the suite with this scenario
    alone; `--ray` puts Ray Serve's `@serve.batch` in `--quick` too (the full run has it)."""
    from . import suite

    args = list(sys.argv[1:] if argv is None else argv)
    if "--ray" in args:
        args.remove("--ray")
        suite.SCENARIOS[NAME] = replace(SCENARIO, quick=replace(SCENARIO.quick, ray=True))
    return suite.main(["--only", NAME, *args])


if __name__ == "__main__":
    sys.exit(main())
