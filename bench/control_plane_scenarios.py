"""The suite's control-plane scenarios, run by the standalone scripts' own code.

`control_plane`: `bench.control_plane` (the null model, 1 controller + 2 workers, through gRPC
and the HTTP gateway, next to a bare two-hop grpc.aio echo). `dispatch`: `bench.many_workers`
(100 simulated workers, 10,000 queued jobs).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

from . import _scenario as sc
from . import control_plane, many_workers


@dataclass(frozen=True)
class ControlPlaneSettings:
    """Flags of `bench.control_plane` used by the suite; the defaults are the full run."""

    total: int = 10_000
    concurrency: int = 64
    rounds: int = 3
    workers: int = 2
    slots: int = 32
    warmup: int = 200

    @classmethod
    def quick(cls) -> ControlPlaneSettings:
        return replace(cls(), total=300, rounds=1, warmup=50)


def _argv(settings: Any) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in sc.settings_dict(settings).items()]


def run_control_plane(settings: ControlPlaneSettings, ctx: sc.Context) -> dict[str, Any]:
    args = control_plane.parse_args(_argv(settings))
    report = asyncio.run(control_plane.run(args, ctx.log_dir))
    report.pop("machine", None)  # the suite records the machine once
    m = report["median"]
    c = settings.concurrency
    report["rows"] = [
        sc.Row(
            "control_plane",
            f"null, c{c}, gRPC: calls/s (p50)",
            f"{sc.fmt_rate(m['omnirt_per_s'])} ({sc.fmt_ms(m['omnirt_p50_ms'])})",
            f"echo {sc.fmt_rate(m['echo_per_s'])} ({sc.fmt_ms(m['echo_p50_ms'])})",
            m["throughput_ratio"],
        ).as_dict(),
        sc.Row(
            "control_plane",
            f"null, c{c}, HTTP POST /v1/generate: calls/s (p50)",
            f"{sc.fmt_rate(m['omnirt_http_per_s'])} ({sc.fmt_ms(m['omnirt_http_p50_ms'])})",
            f"echo {sc.fmt_rate(m['echo_per_s'])} ({sc.fmt_ms(m['echo_p50_ms'])})",
            m["http_throughput_ratio"],
        ).as_dict(),
    ]
    return report


def control_plane_md(result: dict[str, Any]) -> str:
    s = result["settings"]
    header = [
        "round",
        "system",
        "calls/s",
        "p50",
        "p99",
        "ok",
        "failures",
        "CPU cores (controller / workers / client)",
    ]
    rows = []
    for i, r in enumerate(result["rounds"], 1):
        for name, label in (
            ("omnirt", "OmniRT gRPC"),
            ("omnirt_http", "OmniRT HTTP"),
            ("echo", "echo relay"),
        ):
            if name not in r:
                continue
            x = r[name]
            cpu = x["cpu_cores_used"]
            own = cpu.get("load_process", 0)
            servers = " / ".join(f"{v}" for k, v in cpu.items() if k != "load_process")
            rows.append(
                [
                    i,
                    label,
                    f"{x['per_s']:,.1f}",
                    sc.fmt_ms(x["p50_ms"]),
                    sc.fmt_ms(x["p99_ms"]),
                    x["ok"],
                    ", ".join(f"{k} {v}" for k, v in x["failures"].items()) or "-",
                    f"{servers} / {own}",
                ]
            )
    m = result["median"]
    batch = result["rounds"][-1]["omnirt"].get("batch_sizes", {})
    return "\n\n".join(
        [
            f"`python -m bench.control_plane --total {s['total']} --concurrency {s['concurrency']} "
            f"--rounds {s['rounds']} --workers {s['workers']} --slots {s['slots']}`: one `omnirt-controller "
            f"--http` and {s['workers']} x `omnirt-worker --models null --slots {s['slots']}`, "
            "and beside them a "
            'bare grpc.aio relay (an echo "controller" process forwarding each unary call to an echo '
            '"worker" process: raw bytes of the sizes of OmniRT\'s Generate request and response '
            f"({result['message_bytes']['request']} B / {result['message_bytes']['response']} B), "
            "no protobuf, "
            "no OmniRT code: the most a two-hop Python control plane does on this machine). After "
            f"{s['warmup']} untimed calls to each, every round sends {s['total']:,} calls with "
            f"{s['concurrency']} in flight (a closed loop from one client process) through the SDK, then as "
            "`POST /v1/generate` through the HTTP gateway (aiohttp), then through the relay.",
            sc.md_table(header, rows, right=2),
            f"Medians of the rounds: OmniRT gRPC **{m['omnirt_per_s']:,.1f} calls/s**, p50 "
            f"{sc.fmt_ms(m['omnirt_p50_ms'])}, p99 {sc.fmt_ms(m['omnirt_p99_ms'])} "
            f"(**x{m['throughput_ratio']:.2f}** of the relay's {m['echo_per_s']:,.1f}/s); HTTP gateway "
            f"**{m['omnirt_http_per_s']:,.1f} calls/s**, p50 {sc.fmt_ms(m['omnirt_http_p50_ms'])} "
            f"(x{m['http_throughput_ratio']:.2f}). Controller VmHWM {result['controller_vm_hwm_mib']} MiB. "
            f"Jobs per pipeline call in the last round (`batch_size` -> calls): {sc.fmt_counts(batch)}.",
            "What the numbers mean: **calls/s** is successful calls over the round's wall time (a closed "
            "loop: the most the system does with that many callers, not a latency at a given rate); "
            "**p50/p99** the latency of one call as the client sees it, at saturation mostly waiting in the "
            "controller's event loop; **ratio** OmniRT over the relay in the same round. Per job the "
            "controller handles about ten messages (the call in and out, the assignment, the worker's "
            "events, the result), each converted between protobuf and dataclasses, plus validation, the "
            "job store and the event log, against the relay's four message operations per call.",
        ]
    )


CONTROL_PLANE = sc.Scenario(
    "control_plane",
    "Control plane: null model, 1 controller + 2 workers, gRPC and HTTP, vs a bare two-hop gRPC echo",
    ControlPlaneSettings(),
    ControlPlaneSettings.quick(),
    run_control_plane,
    control_plane_md,
    needs_models=False,
)


@dataclass(frozen=True)
class DispatchSettings:
    """Flags of `bench.many_workers` used by the suite; the defaults are the full run."""

    workers: int = 100
    slots: int = 1
    jobs: int = 10_000
    concurrency: int = 64

    @classmethod
    def quick(cls) -> DispatchSettings:
        return replace(cls(), workers=10, jobs=300)


def run_dispatch(settings: DispatchSettings, ctx: sc.Context) -> dict[str, Any]:
    args = many_workers.parse_args(_argv(settings))
    report = asyncio.run(many_workers.run(args, ctx.log_dir))
    report.pop("machine", None)
    p1, p2 = report["queued_first"], report["burst"]
    lat = p2["dispatch_latency"]
    report["rows"] = [
        sc.Row(
            "dispatch",
            f"{settings.workers} workers, {settings.jobs:,} queued jobs: drain",
            f"{p1['drain_s']} s ({sc.fmt_rate(p1['drain_jobs_per_s'])})",
        ).as_dict(),
        sc.Row(
            "dispatch",
            f"burst of {settings.jobs:,}, c{settings.concurrency}: Submit -> assignment p50 / p99",
            f"{sc.fmt_ms(lat['p50_ms'])} / {sc.fmt_ms(lat['p99_ms'])}",
        ).as_dict(),
        sc.Row(
            "dispatch",
            "controller memory per queued job",
            f"{p1['controller_kib_per_queued_job']} KiB",
        ).as_dict(),
    ]
    return report


def dispatch_md(result: dict[str, Any]) -> str:
    s = result["settings"]
    p1, p2 = result["queued_first"], result["burst"]
    lat = p2["dispatch_latency"]
    rows = [
        [
            "controller RSS idle -> with the jobs queued",
            f"{p1['controller_rss_idle_mib']} -> {p1['controller_rss_queued_mib']} MiB",
        ],
        ["**controller memory per queued job**", f"**{p1['controller_kib_per_queued_job']} KiB**"],
        [
            "Submit with no worker connected (the queue grows)",
            f"{sc.fmt_rate(p1['submit']['per_s'])}, p50 {sc.fmt_ms(p1['submit']['p50_ms'])}, "
            f"p99 {sc.fmt_ms(p1['submit']['p99_ms'])}",
        ],
        [f"{s['workers']} workers connected (all welcomed)", f"{p1['all_workers_welcomed_s']} s"],
        [
            "**queue drain** (from connecting to the last assignment)",
            f"**{p1['drain_s']} s ({sc.fmt_rate(p1['drain_jobs_per_s'])})**, "
            f"assignment sizes {sc.fmt_counts(p1['assignment_sizes'])}",
        ],
        [
            "Submit with the workers idle (burst)",
            f"{sc.fmt_rate(p2['submit']['per_s'])}, p50 {sc.fmt_ms(p2['submit']['p50_ms'])}, "
            f"p99 {sc.fmt_ms(p2['submit']['p99_ms'])}",
        ],
        [
            "**dispatch latency** in the burst (Submit call -> the worker has the assignment)",
            f"**p50 {sc.fmt_ms(lat['p50_ms'])}, p99 {sc.fmt_ms(lat['p99_ms'])}**, "
            f"max {sc.fmt_ms(lat['max_ms'])}",
        ],
        [
            "burst drain (first Submit -> last assignment)",
            f"{p2['drain_s']} s ({sc.fmt_rate(p2['drain_jobs_per_s'])}); "
            f"assignment sizes {sc.fmt_counts(p2['assignment_sizes'])}",
        ],
        [
            "controller CPU (cores): submit / drain / burst",
            f"{p1['submit_cpu_cores']['controller']} / {p1['drain_cpu_cores']['controller']} / "
            f"{p2['cpu_cores']['controller']}",
        ],
        ["controller VmHWM at the end", f"{result['controller_vm_hwm_mib']} MiB"],
        ["reconnects / duplicate assignments", f"{p2['reconnects']} / {p2['duplicate_assignments']}"],
    ]
    return "\n\n".join(
        [
            f"`python -m bench.many_workers --workers {s['workers']} --slots {s['slots']} --jobs {s['jobs']} "
            f"--concurrency {s['concurrency']}`: one load process opens {s['workers']} worker streams to the "
            "controller (one TCP connection each) speaking `WorkerGatewayService.Connect` directly (Hello, "
            "heartbeats, and one result per assigned job at once, an 8x8 PNG). Phase 1 submits the jobs with "
            "no worker connected, reads the controller's RSS, then connects the workers and times the "
            "drain; phase 2 submits as many again to the idle workers and times each job from its `Submit` "
            "call to the moment a simulated worker reads its assignment.",
            sc.md_table(["measure", "value"], rows, right=1),
            "What the numbers mean: **memory per queued job** is (RSS with the jobs queued - RSS idle) / "
            "jobs; **queue drain** how fast a controller with a full queue hands work to workers that "
            "answer at once (dispatch, batching, conversions); **dispatch latency** at saturation equals "
            "the Submit latency (the controller's event loop is the queue).",
        ]
    )


DISPATCH = sc.Scenario(
    "dispatch",
    "Dispatch at scale: many simulated workers and a deep queue",
    DispatchSettings(),
    DispatchSettings.quick(),
    run_dispatch,
    dispatch_md,
    needs_models=False,
)
