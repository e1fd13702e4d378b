"""Control-plane throughput and latency, side by side with the ceiling of a bare two-hop gRPC relay.

Starts one `omnirt-controller` and `--workers` `omnirt-worker --models null` processes on
loopback, and next to them a bare grpc.aio relay: an echo "controller" process that forwards
each unary call to an echo "worker" process (raw bytes of the sizes of OmniRT's Generate request
and response: no protobuf, no OmniRT code), the most a Python control plane with two hops can do
on this machine. Then, `--rounds` times, it drives `--total` calls with `--concurrency` in flight
from this process (a closed loop: each caller sends its next call when its last one returns):
first `AsyncClient.generate(model="null")`, then the same as `POST /v1/generate` through the
controller's HTTP gateway (`--http`; aiohttp client, one keep-alive connection per caller), right
after that through the relay. All systems stay up for the whole run, so each round compares
them under the same machine load; the summary gives the median of the rounds.

    python -m bench.control_plane --total 10000 --concurrency 64 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

import omnirt
from omnirt import _convert

from . import _machine
from ._daemons import (
    Controller,
    Daemon,
    Worker,
    free_port,
    null_worker,
    proc_cpu_s,
    proc_status_kib,
    run_benchmark,
)
from ._echo import METHOD
from ._http import post_json, session
from ._load import drive

PROMPT = "a benchmark of the control plane"
SEEDS = 1000  # seeds cycle, so the null worker's encoded images stay cached


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.control_plane", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--total", type=int, default=10_000, help="calls per round and system (default 10000)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="calls in flight (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="OmniRT-then-echo rounds (default 3)")
    parser.add_argument("--workers", type=int, default=2, help="null workers (default 2)")
    parser.add_argument("--slots", type=int, default=32, help="slots per worker (default 32)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls first (default 200)")
    parser.add_argument("--log-level", default="INFO", help="log level of the daemons (default INFO)")
    parser.add_argument("--max-seconds", type=float, default=300, help="no new call after this, per load")
    parser.add_argument(
        "--http",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also drive the controller's HTTP gateway, POST /v1/generate (default on)",
    )
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    return parser.parse_args(argv)


class System:
    """Processes under test and the call that drives them."""

    def __init__(self, name: str, pids: dict[str, int], call: Callable[[int], Awaitable[None]]) -> None:
        self.name = name
        self.pids = pids
        self.call = call

    async def load(self, args: argparse.Namespace, total: int) -> dict[str, Any]:
        """One timed load, with the CPU (in cores) each process and this one used meanwhile."""
        before = {name: proc_cpu_s(pid) for name, pid in self.pids.items()}
        own_before = time.process_time()
        result = await drive(self.call, total, args.concurrency, args.max_seconds)
        wall = result.wall_s or 1.0
        cpu = {name: round((proc_cpu_s(pid) - before[name]) / wall, 2) for name, pid in self.pids.items()}
        cpu["load_process"] = round((time.process_time() - own_before) / wall, 2)
        return {**result.summary(), "cpu_cores_used": cpu}


def start_omnirt(args: argparse.Namespace, log_dir: Path, http: str = "") -> tuple[Controller, list[Worker]]:
    """The controller (with the HTTP gateway on `http` when given) and the null workers."""
    http_args = ("--http", http) if http else ()
    controller = Controller(log_dir, "--log-level", args.log_level, *http_args).start()
    workers = [
        null_worker(
            log_dir,
            controller.address,
            f"bench-w{i}",
            *("--models", "null", "--slots", str(args.slots), "--log-level", args.log_level),
        ).start()
        for i in range(args.workers)
    ]
    return controller, workers


def start_echo(log_dir: Path, response_bytes: int) -> tuple[Daemon, Daemon, str]:
    """The echo worker and the relay in front of it; returns them and the relay's address."""
    worker_address = f"127.0.0.1:{free_port()}"
    relay_address = f"127.0.0.1:{free_port()}"
    module = [sys.executable, "-m", "bench._echo"]
    worker = Daemon(
        "echo-worker",
        [*module, "worker", "--listen", worker_address, "--response-bytes", str(response_bytes)],
        log_dir,
    ).start()
    relay = Daemon(
        "echo-relay", [*module, "relay", "--listen", relay_address, "--upstream", worker_address], log_dir
    ).start()
    return worker, relay, relay_address


async def _until_answered(call: Callable[[int], Awaitable[None]], timeout_s: float) -> None:
    started = time.monotonic()
    while True:
        try:
            await call(0)
            return
        except grpc.RpcError:
            if time.monotonic() - started > timeout_s:
                raise
            await asyncio.sleep(0.1)


def _median(rounds: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in rounds), 2)


async def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    machine = _machine.describe()
    daemons: list[Daemon] = []
    http_address = f"127.0.0.1:{free_port()}" if args.http else ""
    try:
        controller, workers = start_omnirt(args, log_dir, http_address)
        daemons += [*workers, controller]
        controller.wait_workers({w.worker_id for w in workers})
        async with omnirt.AsyncClient(controller.address) as client, session() as http_client:
            batch_sizes: Counter[int] = Counter()

            async def generate(i: int) -> None:
                result = await client.generate(model="null", prompt=PROMPT, seed=i % SEEDS, timeout=120)
                batch_sizes[result.report.batch_size] += 1

            generate_url = f"http://{http_address}/v1/generate"

            async def generate_http(i: int) -> None:
                body = {"model": "null", "prompt": PROMPT, "seed": i % SEEDS}
                await post_json(http_client, generate_url, body)

            # The sizes on the wire, for the echo.
            request = _convert.request_to_proto(omnirt.GenerateRequest(model="null", prompt=PROMPT, seed=1))
            response = await client.generation.Generate(request, timeout=60)
            request_bytes, response_bytes = request.ByteSize(), response.ByteSize()

            echo_worker, relay, relay_address = start_echo(log_dir, response_bytes)
            daemons += [relay, echo_worker]
            async with grpc.aio.insecure_channel(relay_address) as channel:
                stub = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
                payload = b"r" * request_bytes

                async def echo(i: int) -> None:
                    await stub(payload, timeout=30)

                await _until_answered(echo, 30)
                omnirt_pids = {"controller": controller.pid, **{w.name: w.pid for w in workers}}
                systems = [System("omnirt", omnirt_pids, generate)]
                if args.http:
                    systems.append(System("omnirt_http", omnirt_pids, generate_http))
                systems.append(System("echo", {"relay": relay.pid, "echo_worker": echo_worker.pid}, echo))
                for system in systems:
                    await drive(system.call, args.warmup, args.concurrency, args.max_seconds)
                rounds = []
                for _ in range(args.rounds):
                    batch_sizes.clear()
                    numbers = {s.name: await s.load(args, args.total) for s in systems}
                    numbers["omnirt"]["batch_sizes"] = dict(sorted(batch_sizes.items()))
                    numbers["throughput_ratio"] = round(
                        numbers["omnirt"]["per_s"] / numbers["echo"]["per_s"], 3
                    )
                    numbers["p50_latency_ratio"] = round(
                        numbers["omnirt"]["p50_ms"] / numbers["echo"]["p50_ms"], 2
                    )
                    if args.http:
                        numbers["http_throughput_ratio"] = round(
                            numbers["omnirt_http"]["per_s"] / numbers["echo"]["per_s"], 3
                        )
                    rounds.append(numbers)
        memory = {
            "controller_vm_hwm_mib": round(proc_status_kib(controller.pid, "VmHWM") / 1024, 1),
            "controller_vm_rss_mib": round(proc_status_kib(controller.pid, "VmRSS") / 1024, 1),
        }
    finally:
        for daemon in daemons:
            daemon.stop()
    omnirt_rounds = [r["omnirt"] for r in rounds]
    echo_rounds = [r["echo"] for r in rounds]
    http_median = {}
    if args.http:
        http_rounds = [r["omnirt_http"] for r in rounds]
        http_median = {
            "omnirt_http_per_s": _median(http_rounds, "per_s"),
            "omnirt_http_p50_ms": _median(http_rounds, "p50_ms"),
            "omnirt_http_p99_ms": _median(http_rounds, "p99_ms"),
            "http_throughput_ratio": _median(rounds, "http_throughput_ratio"),
        }
    return {
        "machine": machine,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "message_bytes": {"request": request_bytes, "response": response_bytes},
        "rounds": rounds,
        "median": {
            "omnirt_per_s": _median(omnirt_rounds, "per_s"),
            "omnirt_p50_ms": _median(omnirt_rounds, "p50_ms"),
            "omnirt_p99_ms": _median(omnirt_rounds, "p99_ms"),
            "echo_per_s": _median(echo_rounds, "per_s"),
            "echo_p50_ms": _median(echo_rounds, "p50_ms"),
            "echo_p99_ms": _median(echo_rounds, "p99_ms"),
            "throughput_ratio": _median(rounds, "throughput_ratio"),
            "p50_latency_ratio": _median(rounds, "p50_latency_ratio"),
            **http_median,
        },
        "failures": sum((Counter(r["omnirt"]["failures"]) for r in rounds), Counter()),
        "http_failures": sum(
            (Counter(r["omnirt_http"]["failures"]) for r in rounds if "omnirt_http" in r), Counter()
        ),
        **memory,
    }


def print_report(report: dict[str, Any]) -> None:
    header = f"{'round':<8}{'system':<12}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'ok':>8}"
    print(f"{header}  failures / CPU cores")
    for i, r in enumerate(report["rounds"], 1):
        for name in ("omnirt", "omnirt_http", "echo"):
            if name not in r:
                continue
            s = r[name]
            numbers = f"{s['per_s']:>10.1f}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['ok']:>8}"
            print(f"{i:<8}{name:<12}{numbers}  {s['failures'] or '-'} / {s['cpu_cores_used']}")
        print(
            f"{'':<8}omnirt/echo: throughput x{r['throughput_ratio']}, p50 latency x{r['p50_latency_ratio']}"
        )
    m = report["median"]
    print(
        f"median: omnirt {m['omnirt_per_s']}/s p50 {m['omnirt_p50_ms']} ms p99 {m['omnirt_p99_ms']} ms; "
        f"echo {m['echo_per_s']}/s p50 {m['echo_p50_ms']} ms; "
        f"throughput x{m['throughput_ratio']}, p50 latency x{m['p50_latency_ratio']}"
    )
    if "omnirt_http_per_s" in m:
        print(
            f"median HTTP: {m['omnirt_http_per_s']}/s p50 {m['omnirt_http_p50_ms']} ms "
            f"p99 {m['omnirt_http_p99_ms']} ms; throughput x{m['http_throughput_ratio']} of the echo"
        )
    print(
        f"controller VmHWM {report['controller_vm_hwm_mib']} MiB; messages {report['message_bytes']} bytes; "
        f"batch sizes (last round) {report['rounds'][-1]['omnirt']['batch_sizes']}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_benchmark(
        lambda log_dir: run(args, log_dir),
        print_report,
        args.json,
        (TimeoutError, RuntimeError, grpc.RpcError),
        2000,
    )


if __name__ == "__main__":
    sys.exit(main())
