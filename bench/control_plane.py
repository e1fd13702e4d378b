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

`--secure` adds a second controller and its workers with everything of issue 16 on: TLS on
gRPC and the HTTP gateway, `--auth-keys` (the load calls with a user key), `--worker-token-file`
(workers with `--token-file --tls-ca`). Each round drives it right next to the plain one (the
pair swaps places every round, so neither always goes first) and reports secure over plain,
in calls/s and in CPU per call. `--secure tls` or `--secure keys` turns on one part alone;
`--secure none` nothing, two equal stacks: how far apart they measure is the noise floor.
`--profile-dir DIR` runs the controllers under cProfile (for where the time goes, not for the
numbers).

    python -m bench.control_plane --total 10000 --concurrency 64 --rounds 3 --json out.json
    python -m bench.control_plane --total 5000 --concurrency 64 --rounds 3 --secure
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

import omnirt
from omnirt._internal import convert as _convert

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
from ._secure import PARTS, SecureFiles, refusals

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
    parser.add_argument(
        "--secure",
        nargs="?",
        const="all",
        default="",
        choices=PARTS,
        help="also run a controller and workers with TLS, API keys and the worker token, in the same "
        "rounds, and report secure / plain; `--secure tls` or `--secure keys` turns on only that part, "
        "`--secure none` nothing (two equal stacks: the noise floor)",
    )
    parser.add_argument(
        "--profile-dir",
        type=Path,
        help="run each controller under cProfile (its main thread's CPU time) and write its profile "
        "here (NAME.prof, at its exit; slows the controllers, so not for the numbers)",
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
        """One timed load, with the CPU each process and this one used meanwhile: in cores, and
        in microseconds per successful call (what a call costs, less moved by the machine's load
        than calls/s)."""
        before = {name: proc_cpu_s(pid) for name, pid in self.pids.items()}
        controller = self.pids.get("controller")
        # The controller's main thread runs the asyncio loop and all Python code; gRPC's own
        # threads (TLS, the transport) are the rest of its CPU.
        loop_before = proc_cpu_s(controller, controller) if controller else 0.0
        own_before = time.process_time()
        result = await drive(self.call, total, args.concurrency, args.max_seconds)
        used = {name: proc_cpu_s(pid) - before[name] for name, pid in self.pids.items()}
        used["load_process"] = time.process_time() - own_before
        wall, ok = result.wall_s or 1.0, result.ok or 1
        loop = {}
        if controller:
            loop = {
                "controller_loop_us_per_call": round(
                    (proc_cpu_s(controller, controller) - loop_before) / ok * 1e6
                )
            }
        return {
            **result.summary(),
            "cpu_cores_used": {name: round(s / wall, 2) for name, s in used.items()},
            "cpu_us_per_call": {name: round(s / ok * 1e6) for name, s in used.items()},
            **loop,
        }


@dataclass
class Stack:
    """One controller and its null workers; `secure` holds its TLS and key files when they are on."""

    name: str  # "omnirt" or "omnirt_secure": the name of its gRPC load ("..._http": HTTP's)
    controller: Controller
    workers: list[Worker]
    http_url: str  # the gateway's base URL ("" without --http)
    secure: SecureFiles | None = None
    batch_sizes: Counter[int] = field(default_factory=Counter)

    @property
    def daemons(self) -> list[Daemon]:
        return [*self.workers, self.controller]

    @property
    def pids(self) -> dict[str, int]:
        return {"controller": self.controller.pid, **{w.name: w.pid for w in self.workers}}

    def client(self) -> omnirt.AsyncClient:
        if self.secure is None:
            return omnirt.AsyncClient(self.controller.address)
        return self.secure.client(self.controller.address)

    def http_session(self) -> Any:
        if self.secure is None:
            return session()
        return session(self.secure.ssl_context(), self.secure.http_headers())


def start_omnirt(
    args: argparse.Namespace, log_dir: Path, http: bool, secure: SecureFiles | None = None
) -> Stack:
    """The controller (with the HTTP gateway when `http`) and the null workers, not yet waited for.

    With `secure`, TLS, API keys and the worker token are on (workers `bench-s0`, ... instead
    of `bench-w0`, ...)."""
    http_address = f"127.0.0.1:{free_port()}" if http else ""
    http_args = ("--http", http_address) if http else ()
    name = "omnirt_secure" if secure else "omnirt"
    controller = Controller(
        log_dir,
        "--log-level",
        args.log_level,
        *http_args,
        *(secure.controller_flags() if secure else ()),
        tls_ca=secure.ca_path if secure else None,
        api_key=secure.admin if secure else None,  # the readiness check's ListWorkers
    )
    if args.profile_dir:
        # The profile is written when the controller returns from main (SIGTERM drains, then returns).
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        module = controller.argv.index("omnirt.controller.main")
        profile = str(args.profile_dir / f"{name}.prof")
        controller.argv[module - 1 : module + 1] = [
            "-m",
            "bench._profiled",
            profile,
            "omnirt.controller.main",
        ]
    controller.start()
    prefix = "bench-s" if secure else "bench-w"
    workers = [
        null_worker(
            log_dir,
            controller.address,
            f"{prefix}{i}",
            *("--models", "null", "--slots", str(args.slots), "--log-level", args.log_level),
            *(secure.worker_flags() if secure else ()),
        ).start()
        for i in range(args.workers)
    ]
    scheme = "https" if secure and secure.tls else "http"
    url = f"{scheme}://{http_address}" if http else ""
    return Stack(name, controller, workers, url, secure)


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


# The systems in the order a round's numbers are listed (a round drives them as round_order says).
SYSTEMS = ("omnirt", "omnirt_secure", "omnirt_http", "omnirt_secure_http", "echo")


def round_order(groups: list[list[System]], index: int) -> list[System]:
    """The systems of round `index` (from 0) in the order they are driven.

    Groups keep their order (gRPC, HTTP, echo); inside a group (plain and secure) the members
    swap places every round, so neither always runs first, right after the other's load."""
    return [s for group in groups for s in (group if index % 2 == 0 else group[::-1])]


def _ratio(numbers: dict[str, Any], name: str, over: str, key: str, digits: int) -> float:
    below = numbers[over][key]
    return round(numbers[name][key] / below, digits) if below else 0.0


def round_ratios(numbers: dict[str, Any]) -> dict[str, float]:
    """One round's ratios: OmniRT over the echo and, with the secure stack, secure over plain."""
    ratios = {
        "throughput_ratio": _ratio(numbers, "omnirt", "echo", "per_s", 3),
        "p50_latency_ratio": _ratio(numbers, "omnirt", "echo", "p50_ms", 2),
    }
    if "omnirt_http" in numbers:
        ratios["http_throughput_ratio"] = _ratio(numbers, "omnirt_http", "echo", "per_s", 3)
    if "omnirt_secure" in numbers:
        ratios["secure_ratio"] = _ratio(numbers, "omnirt_secure", "omnirt", "per_s", 3)
        ratios["secure_p50_ratio"] = _ratio(numbers, "omnirt_secure", "omnirt", "p50_ms", 2)
        if "cpu_us_per_call" in numbers["omnirt"]:
            # CPU per call, secure over plain: the controller's, and all processes' (the client's
            # and the workers' TLS included) which on shared cores is what bounds calls/s.
            plain, secure = numbers["omnirt"]["cpu_us_per_call"], numbers["omnirt_secure"]["cpu_us_per_call"]
            below = plain["controller"]
            ratios["secure_controller_cpu_ratio"] = round(secure["controller"] / below, 3) if below else 0.0
            below = sum(plain.values())
            ratios["secure_total_cpu_ratio"] = round(sum(secure.values()) / below, 3) if below else 0.0
            below = numbers["omnirt"].get("controller_loop_us_per_call", 0)
            if below:
                loop = numbers["omnirt_secure"]["controller_loop_us_per_call"]
                ratios["secure_controller_loop_cpu_ratio"] = round(loop / below, 3)
    if "omnirt_secure_http" in numbers:
        ratios["secure_http_ratio"] = _ratio(numbers, "omnirt_secure_http", "omnirt_http", "per_s", 3)
    return ratios


def _medians(rounds: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in SYSTEMS:
        loads = [r[name] for r in rounds if name in r]
        if loads:
            out |= {f"{name}_{key}": _median(loads, key) for key in ("per_s", "p50_ms", "p99_ms")}
    for key in rounds[0]:
        if key.endswith("_ratio"):
            out[key] = _median(rounds, key)
    return out


def _calls(
    stack: Stack, client: omnirt.AsyncClient, http_client: Any
) -> tuple[Callable[[int], Awaitable[None]], Callable[[int], Awaitable[None]]]:
    """The gRPC call (the SDK's generate) and the HTTP call (POST /v1/generate) to `stack`."""

    async def generate(i: int) -> None:
        result = await client.generate(model="null", prompt=PROMPT, seed=i % SEEDS, timeout=120)
        stack.batch_sizes[result.report.batch_size] += 1

    generate_url = f"{stack.http_url}/v1/generate"

    async def generate_http(i: int) -> None:
        await post_json(http_client, generate_url, {"model": "null", "prompt": PROMPT, "seed": i % SEEDS})

    return generate, generate_http


def _vm_mib(pid: int, key: str) -> float:
    return round(proc_status_kib(pid, key) / 1024, 1)


async def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    machine = _machine.describe()
    daemons: list[Daemon] = []
    stacks: list[Stack] = []
    try:
        # Both stacks start before either is waited for: their startups overlap.
        stacks.append(start_omnirt(args, log_dir, args.http))
        daemons += stacks[-1].daemons
        if args.secure:
            files = SecureFiles.make(log_dir / "secure", args.secure)
            stacks.append(start_omnirt(args, log_dir, args.http, files))
            daemons += stacks[-1].daemons
        for stack in stacks:
            stack.controller.wait_workers({w.worker_id for w in stack.workers})
        plain = stacks[0]
        refused: dict[str, str] = {}
        secured = stacks[-1]
        if secured.secure is not None:
            refused = await refusals(secured.controller.address, secured.http_url, secured.secure)
        async with contextlib.AsyncExitStack() as opened:
            grpc_group, http_group = [], []
            for stack in stacks:
                client = await opened.enter_async_context(stack.client())
                http_client = await opened.enter_async_context(stack.http_session())
                generate, generate_http = _calls(stack, client, http_client)
                grpc_group.append(System(stack.name, stack.pids, generate))
                http_group.append(System(f"{stack.name}_http", stack.pids, generate_http))
                if stack is plain:
                    plain_client = client

            # The sizes on the wire, for the echo.
            request = _convert.request_to_proto(omnirt.GenerateRequest(model="null", prompt=PROMPT, seed=1))
            response = await plain_client.generation.Generate(request, timeout=60)
            request_bytes, response_bytes = request.ByteSize(), response.ByteSize()

            echo_worker, relay, relay_address = start_echo(log_dir, response_bytes)
            daemons += [relay, echo_worker]
            channel = await opened.enter_async_context(grpc.aio.insecure_channel(relay_address))
            stub = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            payload = b"r" * request_bytes

            async def echo(i: int) -> None:
                await stub(payload, timeout=30)

            await _until_answered(echo, 30)
            echo_system = System("echo", {"relay": relay.pid, "echo_worker": echo_worker.pid}, echo)
            groups = [grpc_group, *([http_group] if args.http else []), [echo_system]]
            for system in round_order(groups, 0):
                await drive(system.call, args.warmup, args.concurrency, args.max_seconds)
            rounds: list[dict[str, Any]] = []
            for index in range(args.rounds):
                for stack in stacks:
                    stack.batch_sizes.clear()
                loads = {s.name: await s.load(args, args.total) for s in round_order(groups, index)}
                for stack in stacks:
                    loads[stack.name]["batch_sizes"] = dict(sorted(stack.batch_sizes.items()))
                numbers = {name: loads[name] for name in SYSTEMS if name in loads}
                rounds.append({**numbers, **round_ratios(numbers)})
        memory = {
            "controller_vm_hwm_mib": _vm_mib(plain.controller.pid, "VmHWM"),
            "controller_vm_rss_mib": _vm_mib(plain.controller.pid, "VmRSS"),
        }
        if args.secure:
            memory["secure_controller_vm_hwm_mib"] = _vm_mib(stacks[1].controller.pid, "VmHWM")
    finally:
        for daemon in daemons:
            daemon.stop()

    def failures(name: str) -> Counter[str]:
        return sum((Counter(r[name]["failures"]) for r in rounds if name in r), Counter())

    return {
        "machine": machine,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "message_bytes": {"request": request_bytes, "response": response_bytes},
        "rounds": rounds,
        "median": _medians(rounds),
        "failures": failures("omnirt"),
        "http_failures": failures("omnirt_http"),
        **(
            {
                "secure_refusals": refused,
                "secure_failures": failures("omnirt_secure"),
                "secure_http_failures": failures("omnirt_secure_http"),
            }
            if args.secure
            else {}
        ),
        **memory,
    }


def print_report(report: dict[str, Any]) -> None:
    header = f"{'round':<8}{'system':<20}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'ok':>8}"
    print(f"{header}  failures / CPU cores")
    for i, r in enumerate(report["rounds"], 1):
        for name in SYSTEMS:
            if name not in r:
                continue
            s = r[name]
            numbers = f"{s['per_s']:>10.1f}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['ok']:>8}"
            print(f"{i:<8}{name:<20}{numbers}  {s['failures'] or '-'} / {s['cpu_cores_used']}")
        line = f"omnirt/echo: throughput x{r['throughput_ratio']}, p50 latency x{r['p50_latency_ratio']}"
        if "secure_ratio" in r:
            line += f"; secure/plain: throughput x{r['secure_ratio']}, p50 latency x{r['secure_p50_ratio']}"
        if "secure_http_ratio" in r:
            line += f", HTTP throughput x{r['secure_http_ratio']}"
        print(f"{'':<8}{line}")
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
    if "secure_ratio" in m:
        parts = {
            "all": "TLS + API key + worker token",
            "tls": "TLS",
            "keys": "API key + worker token",
            "none": "nothing on: the A/A control",
        }
        line = (
            f"median secure ({parts[report['settings']['secure']]}): {m['omnirt_secure_per_s']}/s "
            f"p50 {m['omnirt_secure_p50_ms']} ms p99 {m['omnirt_secure_p99_ms']} ms; "
            f"secure/plain throughput x{m['secure_ratio']}, CPU per call: controller "
            f"x{m.get('secure_controller_cpu_ratio')}, all processes x{m.get('secure_total_cpu_ratio')}"
        )
        if "secure_http_ratio" in m:
            line += f"; HTTP {m['omnirt_secure_http_per_s']}/s, secure/plain x{m['secure_http_ratio']}"
        print(line)
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
