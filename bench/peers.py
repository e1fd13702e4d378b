"""Peers: OmniRT next to Ray Serve, in the same run on the same machine, at the same concurrencies.

Ray Serve lives in its own virtualenv (`bash bench/ray/setup.sh` makes .venv-bench-ray; never a
dependency of OmniRT) and runs `bench/ray/serve_app.py`: a no-op deployment and tiny-sd (loaded
with plain diffusers from the folder OmniRT's worker built it into), each with and without
`@serve.batch`, one replica each, called through Ray Serve's HTTP proxy with aiohttp.

OmniRT runs, at the same time: the null model (1 controller with the HTTP gateway + 2 workers,
32 slots each) called through the SDK (gRPC) and through `POST /v1/generate`; tiny-sd with
batching off and on (`bench.batching`'s two deployments, one slot each) through the SDK.
For each concurrency, after untimed warm-up calls, the four systems take turns in `rounds`
rounds (each round starts with the next system), the same number of calls each. A system's
calls/s and latencies pool its rounds; a throughput ratio is the median of the ratios of the
rounds, so a burst of load from elsewhere on a shared machine moves one round, not the verdict.
Without the Ray virtualenv the scenario is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import omnirt
from omnirt.controller.config import ControllerConfig

from . import _scenario as sc
from ._http import post_json, session
from ._load import LoadResult, drive, merged
from ._ray import SETUP, RayServe, ray_python
from ._stacks import Stack, start_stack, tiny_sd_stacks

NAME = "peers"
TITLE = "Peers: OmniRT vs Ray Serve, same machine, same run (no-op and tiny-sd, with and without batching)"
PROMPT = "a peer benchmark"
NULL_TARGET = 3.0  # OmniRT's null throughput over Ray Serve's no-op, at concurrency >= 16
SD_BATCH_TARGET = 1.0  # OmniRT's batched tiny-sd throughput over Ray's @serve.batch, at concurrency 4
SEEDS = 1000

Call = Callable[[int], Awaitable[object]]


@dataclass(frozen=True)
class Settings:
    """Counts of the peers scenario; the defaults are the full run."""

    null_concurrencies: tuple[int, ...] = (1, 16, 64)
    null_calls: int = 2000
    sd_concurrencies: tuple[int, ...] = (1, 4, 8)
    sd_calls: int = 160
    size: int = 64
    steps: int = 4
    guidance: float = 7.5
    max_batch_size: int = 8
    # Ray's no-op `@serve.batch` waits as long as OmniRT's busy batch window (its default, 2 ms);
    # the tiny-sd batches wait for nothing on either side (OmniRT's 1-slot workers never wait).
    noop_batch_wait_s: float = ControllerConfig().batch_busy_window_ms / 1000
    rounds: int = 4  # turns per concurrency; each system gets calls / rounds per turn

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), null_calls=100, sd_calls=16, rounds=2)


async def _load_points(
    systems: dict[str, Call], concurrencies: tuple[int, ...], calls: int, rounds: int
) -> list[dict[str, Any]]:
    """Per concurrency: each system's pooled summary, with its calls/s in every round."""
    names = list(systems)
    per_round = max(1, calls // rounds)
    points = []
    for c in concurrencies:
        for call in systems.values():
            await drive(call, max(2 * c, calls // 10), c, 600)
        runs: dict[str, list[LoadResult]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                runs[name].append(await drive(systems[name], per_round, c, 600))
        point: dict[str, Any] = {"concurrency": c}
        for name, results in runs.items():
            point[name] = {**merged(results).summary(), "rounds_per_s": [round(x.rate, 1) for x in results]}
        points.append(point)
    return points


def _round_ratio(point: dict[str, Any], ours: str, theirs: list[str]) -> float | None:
    """The median over rounds of our calls/s over the best of theirs in the same round."""
    ratios = []
    for i, rate in enumerate(point[ours]["rounds_per_s"]):
        best = max(point[t]["rounds_per_s"][i] for t in theirs)
        if best:
            ratios.append(rate / best)
    return round(sc.median(ratios), 3) if ratios else None


async def _measure(
    settings: Settings, null: Stack, sd: dict[str, Stack], ray: RayServe
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    s = settings
    sd_body = {"width": s.size, "height": s.size, "steps": s.steps, "guidance": s.guidance}
    async with (
        omnirt.AsyncClient(null.address) as null_client,
        omnirt.AsyncClient(sd["off"].address) as off_client,
        omnirt.AsyncClient(sd["on"].address) as on_client,
        session() as http,
    ):

        def sd_call(client: omnirt.AsyncClient) -> Call:
            async def call(i: int) -> None:
                await client.generate(
                    model="tiny-sd",
                    prompt=PROMPT,
                    width=s.size,
                    height=s.size,
                    num_inference_steps=s.steps,
                    guidance_scale=s.guidance,
                    seed=i,
                    timeout=600,
                )

            return call

        def ray_call(route: str, body: dict[str, Any]) -> Call:
            url = f"{ray.url}/{route}"

            async def call(i: int) -> None:
                await post_json(http, url, {**body, "prompt": PROMPT, "seed": i % SEEDS})

            return call

        async def null_grpc(i: int) -> None:
            await null_client.generate(model="null", prompt=PROMPT, seed=i % SEEDS, timeout=120)

        async def null_http(i: int) -> None:
            body = {"model": "null", "prompt": PROMPT, "seed": i % SEEDS}
            await post_json(http, f"{null.http_url}/v1/generate", body)

        null_systems: dict[str, Call] = {
            "omnirt_grpc": null_grpc,
            "omnirt_http": null_http,
            "ray": ray_call("noop", {}),
            "ray_batch": ray_call("noop-batch", {}),
        }
        sd_systems: dict[str, Call] = {
            "omnirt": sd_call(off_client),
            "omnirt_batch": sd_call(on_client),
            "ray": ray_call("sd", sd_body),
            "ray_batch": ray_call("sd-batch", sd_body),
        }
        null_points = await _load_points(null_systems, s.null_concurrencies, s.null_calls, s.rounds)
        sd_points = await _load_points(sd_systems, s.sd_concurrencies, s.sd_calls, s.rounds)
    return null_points, sd_points


def _null_ratios(point: dict[str, Any]) -> None:
    point["ray_best"] = "ray" if point["ray"]["per_s"] >= point["ray_batch"]["per_s"] else "ray_batch"
    for name in ("omnirt_grpc", "omnirt_http"):
        point[f"{name}_throughput_ratio"] = _round_ratio(point, name, ["ray", "ray_batch"])
        point[f"{name}_p50_ratio"] = sc.ratio(point[name]["p50_ms"], point[point["ray_best"]]["p50_ms"])


def _sd_ratios(point: dict[str, Any]) -> None:
    for ours, theirs in (("omnirt", "ray"), ("omnirt_batch", "ray_batch")):
        point[f"{ours}_throughput_ratio"] = _round_ratio(point, ours, [theirs])
        point[f"{ours}_p50_ratio"] = sc.ratio(point[ours]["p50_ms"], point[theirs]["p50_ms"])


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    python = ray_python()
    if python is None:
        raise sc.Skipped(f"Ray Serve is not installed: `{SETUP}` makes .venv-bench-ray, then rerun")
    ray = RayServe(
        python,
        ctx.log_dir,
        ctx.model_dir / "tiny-sd",
        ctx.torch_threads,
        settings.max_batch_size,
        settings.noop_batch_wait_s,
    )
    stacks: list[Stack] = []
    try:
        ray.start()
        null = start_stack(ctx, "peers-null", [["--models", "null", "--slots", "32"]] * 2, http=True)
        stacks.append(null)
        sd = tiny_sd_stacks(ctx)
        stacks += sd.values()
        null_points, sd_points = asyncio.run(_measure(settings, null, sd, ray))
    finally:
        for stack in stacks:
            stack.stop()
        ray.stop()
    for point in null_points:
        _null_ratios(point)
    for point in sd_points:
        _sd_ratios(point)
    result = {
        "settings": sc.settings_dict(settings),
        "ray_version": ray.version,
        "ray_ready_s": ray.ready_s,
        "null": null_points,
        "tiny_sd": sd_points,
    }
    result["rows"] = rows(result)
    return result


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in result["null"]:
        c = p["concurrency"]
        best = p[p["ray_best"]]
        ray_label = "Ray" if p["ray_best"] == "ray" else "Ray @serve.batch"
        for name, label in (("omnirt_grpc", "gRPC"), ("omnirt_http", "HTTP")):
            if c == 1:
                out.append(
                    sc.Row(
                        NAME,
                        f"null c1, {label}: p50 latency",
                        sc.fmt_ms(p[name]["p50_ms"]),
                        f"{ray_label} no-op {sc.fmt_ms(best['p50_ms'])}",
                        p[f"{name}_p50_ratio"],
                    )
                )
                continue
            out.append(
                sc.Row(
                    NAME,
                    f"null c{c}, {label}: calls/s",
                    sc.fmt_rate(p[name]["per_s"]),
                    f"{ray_label} no-op {sc.fmt_rate(best['per_s'])}",
                    p[f"{name}_throughput_ratio"],
                    f">= {NULL_TARGET:g}",
                    sc.verdict(p[f"{name}_throughput_ratio"], ">=", NULL_TARGET),
                )
            )
    for p in result["tiny_sd"]:
        c = p["concurrency"]
        if c == 1:
            out.append(
                sc.Row(
                    NAME,
                    "tiny-sd c1: p50 latency",
                    sc.fmt_ms(p["omnirt"]["p50_ms"]),
                    f"Ray {sc.fmt_ms(p['ray']['p50_ms'])}",
                    p["omnirt_p50_ratio"],
                )
            )
            continue
        target = c == 4
        out.append(
            sc.Row(
                NAME,
                f"tiny-sd c{c}, batched: calls/s",
                sc.fmt_rate(p["omnirt_batch"]["per_s"]),
                f"Ray @serve.batch {sc.fmt_rate(p['ray_batch']['per_s'])}",
                p["omnirt_batch_throughput_ratio"],
                f">= {SD_BATCH_TARGET:g}" if target else "",
                sc.verdict(p["omnirt_batch_throughput_ratio"], ">=", SD_BATCH_TARGET) if target else "",
            )
        )
    return [r.as_dict() for r in out]


def _cells(x: dict[str, Any]) -> list[str]:
    failures = ", ".join(f"{k} {v}" for k, v in x["failures"].items()) or "-"
    return [f"{x['per_s']:,.1f}", sc.fmt_ms(x["p50_ms"]), sc.fmt_ms(x["p99_ms"]), failures]


def _rows(points: list[dict[str, Any]], labels: dict[str, str]) -> list[list[Any]]:
    """Table rows: per concurrency, one row per system with its ratios to Ray."""
    rows = []
    for p in points:
        for name, label in labels.items():
            tr = p.get(f"{name}_throughput_ratio")
            pr = p.get(f"{name}_p50_ratio")
            rows.append(
                [
                    p["concurrency"],
                    label,
                    *_cells(p[name]),
                    "" if tr is None else f"**{tr:.2f}**",
                    "" if pr is None else f"{pr:.2f}",
                ]
            )
    return rows


def _turns(rounds: int) -> str:
    if rounds <= 1:
        return "The systems run one after the other."
    return (
        f"The systems take turns in {rounds} rounds per concurrency (each round starts with the next "
        "system); calls/s and latencies pool the rounds, and each throughput ratio is the median of the "
        "rounds' ratios, so a burst of load from elsewhere on the machine moves one round, not the ratio."
    )


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    header = ["concurrency", "system", "calls/s", "p50", "p99", "failures", "throughput ratio", "p50 ratio"]
    null_labels = {
        "omnirt_grpc": "OmniRT null, gRPC (SDK)",
        "omnirt_http": "OmniRT null, HTTP",
        "ray": "Ray Serve no-op",
        "ray_batch": "Ray Serve no-op, @serve.batch",
    }
    sd_labels = {
        "omnirt": "OmniRT tiny-sd, batching off",
        "omnirt_batch": "OmniRT tiny-sd, batching on",
        "ray": "Ray Serve tiny-sd",
        "ray_batch": "Ray Serve tiny-sd, @serve.batch",
    }
    null_rows = _rows(result["null"], null_labels)
    sd_rows = _rows(result["tiny_sd"], sd_labels)
    return "\n\n".join(
        [
            f"`bash bench/ray/setup.sh` once (Ray Serve {result['ray_version']} in its own virtualenv), then "
            "`python -m bench.suite --only peers`. Ray Serve: one local Ray instance, its HTTP proxy on "
            "127.0.0.1, one replica per deployment (`num_cpus=0`, `max_ongoing_requests=256` so that Ray's "
            f"default cap of 5 does not decide), `@serve.batch(max_batch_size={s['max_batch_size']})` like "
            "OmniRT's batcher (up to 8), waiting for companions "
            f"`batch_wait_timeout_s={s.get('noop_batch_wait_s', 0):g}` for the no-op, as long as OmniRT's "
            "busy batch window (`--batch-busy-window-ms`, its default; it applies while jobs of the model "
            "run), and 0 for tiny-sd, where OmniRT's 1-slot workers never wait either; the tiny-sd "
            "replicas run one pipeline call at a time in a thread, with the same torch threads as OmniRT's "
            "workers. "
            f"Ray was ready {result['ray_ready_s']} s after its start. Every system gets "
            f"{s['null_calls']:,} timed calls per concurrency for the no-op / null model and "
            f"{s['sd_calls']} for tiny-sd ({s['size']}x{s['size']}, {s['steps']} steps, guidance "
            f"{s['guidance']}), all of them up the whole time. {_turns(s.get('rounds', 1))}",
            "No-op / null model. Ratios are OmniRT over the better of Ray's two no-op deployments "
            "(throughput: higher is better for OmniRT, the median of the rounds' ratios, each over the "
            "better deployment in that round; p50: lower is, over the deployment with more calls/s "
            f"overall). Target: OmniRT's throughput >= {NULL_TARGET:g}x Ray Serve's.",
            sc.md_table(header, null_rows, right=2),
            "tiny-sd. Ratios: OmniRT with batching off over Ray without `@serve.batch`, and OmniRT with "
            f"batching on over Ray with it. Target: batched throughput at concurrency 4 >= "
            f"{SD_BATCH_TARGET:g}x Ray's batched.",
            sc.md_table(header, sd_rows, right=2),
            "Both sides take two hops: OmniRT client -> controller -> worker, Ray client -> HTTP proxy "
            "actor -> replica actor, each a separate process. "
            "Ray's replica calls the pipeline as diffusers does, OmniRT's worker inside "
            "`torch.inference_mode()` (the same pixels, a little less time per call, see the overhead "
            "scenario). "
            "Both sides encode a PNG per image; OmniRT also hashes it (sha256) and, through HTTP, returns "
            'JSON with base64 and the full RunReport, where Ray returns the raw PNG or `{"ok": true}`. '
            "The load generator, OmniRT's daemons and Ray's processes (GCS, raylet, proxy, controller, "
            "four replicas) share the same cores.",
        ]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown)
