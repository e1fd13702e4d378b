"""Dispatch at scale: `--workers` simulated workers as real gRPC streams from ONE load process.

Each simulated worker opens its own connection to the controller's
`omnirt.worker.v1.WorkerGatewayService.Connect`, says Hello, waits for Welcome, sends heartbeats
at the interval the controller asks for, and answers every Assignment at once with one
AssignmentResult per job carrying an 8x8 PNG (no events). Two phases, one controller:

1. queued first: with no worker connected, `--jobs` jobs are submitted (the controller's RSS is
   read before and after: memory per queued job), then all workers connect at once and the
   queue drains (drain time).
2. burst: with the workers connected and idle, `--jobs` more jobs are submitted at
   `--concurrency`; dispatch latency is from just before each Submit call to the moment the
   simulated worker reads the Assignment holding it (both clocks are this process's).

    python -m bench.many_workers --workers 100 --jobs 10000 --json many_workers.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

import omnirt
from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.worker.modes.null import null_artifact

from . import _machine
from ._daemons import Controller, proc_cpu_s, proc_status_kib, run_benchmark
from ._load import LoadResult, drive
from ._stats import latency_summary_ms

PROMPT = "a benchmark of dispatch"
LABEL = "bench_index"
STREAM_END: Any = grpc.aio.EOF  # type: ignore[attr-defined]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.many_workers", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=100, help="simulated workers (default 100)")
    parser.add_argument("--slots", type=int, default=1, help="slots per simulated worker (default 1)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per phase (default 10000)")
    parser.add_argument("--concurrency", type=int, default=64, help="Submit calls in flight (default 64)")
    parser.add_argument("--log-level", default="INFO", help="the controller's log level (default INFO)")
    parser.add_argument("--max-seconds", type=float, default=300, help="limit of each phase (default 300)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    return parser.parse_args(argv)


class Receipts:
    """When each job's Assignment reached a simulated worker (perf_counter), by bench index."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}
        self.duplicates = 0
        self.batch_sizes: Counter[int] = Counter()
        self.expected = 0
        self.all_in = asyncio.Event()

    def expect(self, count: int) -> None:
        self.at.clear()
        self.duplicates = 0
        self.batch_sizes.clear()
        self.expected = count
        self.all_in.clear()

    def record(self, index: int, when: float) -> None:
        if index in self.at:
            self.duplicates += 1
            return
        self.at[index] = when
        if len(self.at) >= self.expected:
            self.all_in.set()


def _result_message(assignment_id: str, job_id: str, seed: int, worker_id: str) -> pb.ConnectRequest:
    report = t.RunReport(
        job_id=job_id,
        worker_id=worker_id,
        model="null",
        execution_mode="legacy_call",
        pipeline_class="NullPipeline",
        seeds=[seed],
    )
    result = t.GenerateResult(job_id=job_id, artifacts=[null_artifact(seed, 0, job_id, "png")], report=report)
    msg = pb.AssignmentResult(assignment_id=assignment_id, job_id=job_id)
    msg.result.CopyFrom(_convert.result_to_proto(result))
    return pb.ConnectRequest(result=msg)


class SimulatedWorker:
    """One worker stream: Hello, Welcome, heartbeats, and an immediate result per assigned job."""

    def __init__(self, address: str, worker_id: str, slots: int, receipts: Receipts) -> None:
        self.address = address
        self.worker_id = worker_id
        self.slots = slots
        self.receipts = receipts
        self.welcomed = asyncio.Event()
        self.sessions = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a stream open until `stop` is set (reconnecting if the controller drops it)."""
        # A local subchannel pool: one TCP connection per worker, as separate processes would have.
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(self.address, options=options) as channel:
            stub = gateway_pb2_grpc.WorkerGatewayServiceStub(channel)
            while not stop.is_set():
                self.sessions += 1
                call = stub.Connect()
                session = asyncio.create_task(self._session(call))
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait([session, stopper], return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                call.cancel()
                if not session.done():
                    session.cancel()
                await asyncio.gather(session, return_exceptions=True)

    async def _session(self, call: Any) -> None:
        lock = asyncio.Lock()
        hello = pb.Hello(
            worker_id=self.worker_id,
            execution_mode="legacy_call",
            backend="cpu",
            models=["null"],
            slots=self.slots,
            loaded_models=["null"],
            hostname="bench",
            pid=0,
            version=omnirt.__version__,
        )
        await call.write(pb.ConnectRequest(hello=hello))
        welcome = await call.read()
        if welcome is STREAM_END or welcome.WhichOneof("message") != "welcome":
            raise ConnectionError(f"{self.worker_id}: no Welcome")
        interval_s = (welcome.welcome.heartbeat_interval_ms or 5000) / 1000.0
        self.welcomed.set()
        beats = asyncio.create_task(self._heartbeats(call, lock, interval_s))
        try:
            while True:
                msg = await call.read()
                if msg is STREAM_END:
                    return
                if msg.WhichOneof("message") != "assignment":
                    continue  # cancels and drains do not matter here: every job ends at once
                received = time.perf_counter()
                assignment = msg.assignment
                self.receipts.batch_sizes[len(assignment.items)] += 1
                for item in assignment.items:
                    self.receipts.record(int(item.request.labels[LABEL]), received)
                async with lock:
                    for item in assignment.items:
                        answer = _result_message(
                            assignment.assignment_id, item.job_id, item.request.seed, self.worker_id
                        )
                        await call.write(answer)
        finally:
            beats.cancel()

    async def _heartbeats(self, call: Any, lock: asyncio.Lock, interval_s: float) -> None:
        beat = pb.ConnectRequest(heartbeat=pb.Heartbeat(busy_slots=0, loaded_models=["null"]))
        while True:
            async with lock:
                await call.write(beat)
            await asyncio.sleep(interval_s)


async def submit_all(
    client: omnirt.AsyncClient,
    jobs: int,
    offset: int,
    concurrency: int,
    max_s: float,
    sent_at: dict[int, float],
) -> LoadResult:
    """Submit `jobs` null jobs labelled offset..offset+jobs-1; `sent_at` gets each call's start."""

    async def call(i: int) -> None:
        index = offset + i
        sent_at[index] = time.perf_counter()
        await client.submit(model="null", prompt=PROMPT, seed=index, labels={LABEL: str(index)}, timeout=60)

    return await drive(call, jobs, concurrency, max_s)


async def wait_idle(client: omnirt.AsyncClient, timeout: float) -> float:
    """Seconds until the controller has no QUEUED or RUNNING job (polled every 20 ms)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if not await client.list_jobs(states=[omnirt.JobState.QUEUED, omnirt.JobState.RUNNING], limit=1):
            return time.perf_counter() - started
        await asyncio.sleep(0.02)
    raise TimeoutError(f"jobs still queued or running after {timeout:.0f} s")


def _rss_mib(pid: int) -> float:
    return round(proc_status_kib(pid, "VmRSS") / 1024, 1)


async def run(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    machine = _machine.describe()
    max_queue = args.jobs + 1000
    controller = Controller(log_dir, "--max-queue", str(max_queue), "--log-level", args.log_level).start()
    receipts = Receipts()
    stop = asyncio.Event()
    sims = [
        SimulatedWorker(controller.address, f"sim-{i:03d}", args.slots, receipts) for i in range(args.workers)
    ]
    tasks: list[asyncio.Task[None]] = []
    try:
        async with omnirt.AsyncClient(controller.address) as client:
            # Warm the code paths (validation, queue, store) before reading the idle RSS.
            warm = [await client.submit(model="null", prompt=PROMPT, seed=i) for i in range(100)]
            for job in warm:
                await client.cancel(job.id)
            await asyncio.sleep(1.0)
            rss_idle = _rss_mib(controller.pid)

            # ---- phase 1: queued first, then the workers connect -------------------------
            sent_at: dict[int, float] = {}
            cpu_before, own_before = proc_cpu_s(controller.pid), time.process_time()
            queued = await submit_all(client, args.jobs, 0, args.concurrency, args.max_seconds, sent_at)
            submit_cpu = (proc_cpu_s(controller.pid) - cpu_before) / queued.wall_s
            submit_own_cpu = (time.process_time() - own_before) / queued.wall_s
            await asyncio.sleep(1.0)
            rss_queued = _rss_mib(controller.pid)
            receipts.expect(queued.ok)
            cpu_before, own_before = proc_cpu_s(controller.pid), time.process_time()
            connect_start = time.perf_counter()
            tasks = [asyncio.create_task(s.run(stop)) for s in sims]
            await asyncio.wait_for(asyncio.gather(*(s.welcomed.wait() for s in sims)), args.max_seconds)
            all_welcomed_s = time.perf_counter() - connect_start
            await asyncio.wait_for(receipts.all_in.wait(), args.max_seconds)
            drain_s = max(receipts.at.values()) - connect_start
            settle_s = await wait_idle(client, args.max_seconds)
            drain_cpu = (proc_cpu_s(controller.pid) - cpu_before) / (drain_s + settle_s)
            drain_own_cpu = (time.process_time() - own_before) / (drain_s + settle_s)
            phase1 = {
                "submit": queued.summary(),
                "submit_cpu_cores": {
                    "controller": round(submit_cpu, 2),
                    "load_process": round(submit_own_cpu, 2),
                },
                "controller_rss_idle_mib": rss_idle,
                "controller_rss_queued_mib": rss_queued,
                "controller_kib_per_queued_job": round((rss_queued - rss_idle) * 1024 / max(1, queued.ok), 2),
                "all_workers_welcomed_s": round(all_welcomed_s, 3),
                "drain_s": round(drain_s, 3),
                "drain_jobs_per_s": round(queued.ok / drain_s, 1) if drain_s else 0.0,
                "results_settled_after_s": round(settle_s, 3),
                "drain_cpu_cores": {
                    "controller": round(drain_cpu, 2),
                    "load_process": round(drain_own_cpu, 2),
                },
                "assignment_sizes": dict(sorted(receipts.batch_sizes.items())),
                "duplicate_assignments": receipts.duplicates,
            }

            # ---- phase 2: workers connected and idle, then a burst ------------------------
            await asyncio.sleep(1.0)
            receipts.expect(args.jobs)
            sent_at = {}
            cpu_before, own_before = proc_cpu_s(controller.pid), time.process_time()
            burst = await submit_all(
                client, args.jobs, args.jobs, args.concurrency, args.max_seconds, sent_at
            )
            receipts.expected = burst.ok
            if len(receipts.at) < burst.ok:
                await asyncio.wait_for(receipts.all_in.wait(), args.max_seconds)
            first_sent = min(sent_at.values())
            burst_drain_s = max(receipts.at.values()) - first_sent
            settle_s = await wait_idle(client, args.max_seconds)
            burst_cpu = (proc_cpu_s(controller.pid) - cpu_before) / (burst_drain_s + settle_s)
            burst_own_cpu = (time.process_time() - own_before) / (burst_drain_s + settle_s)
            latencies = [receipts.at[i] - sent_at[i] for i in receipts.at if i in sent_at]
            phase2 = {
                "submit": burst.summary(),
                "dispatch_latency": latency_summary_ms(latencies),
                "drain_s": round(burst_drain_s, 3),
                "drain_jobs_per_s": round(burst.ok / burst_drain_s, 1) if burst_drain_s else 0.0,
                "results_settled_after_s": round(settle_s, 3),
                "cpu_cores": {"controller": round(burst_cpu, 2), "load_process": round(burst_own_cpu, 2)},
                "assignment_sizes": dict(sorted(receipts.batch_sizes.items())),
                "duplicate_assignments": receipts.duplicates,
                "reconnects": sum(s.sessions - 1 for s in sims),
            }
            peak = round(proc_status_kib(controller.pid, "VmHWM") / 1024, 1)
    finally:
        stop.set()
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        controller.stop()
    return {
        "machine": machine,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "queued_first": phase1,
        "burst": phase2,
        "controller_vm_hwm_mib": peak,
    }


def print_report(report: dict[str, Any]) -> None:
    p1, p2 = report["queued_first"], report["burst"]
    s = report["settings"]
    print(f"{s['workers']} simulated workers x {s['slots']} slot(s), {s['jobs']} jobs per phase")
    print(
        f"queued first: submit {p1['submit']['per_s']}/s (p50 {p1['submit']['p50_ms']} ms, "
        f"p99 {p1['submit']['p99_ms']} ms, failures {p1['submit']['failures'] or '-'}); "
        f"RSS idle {p1['controller_rss_idle_mib']} MiB -> queued {p1['controller_rss_queued_mib']} MiB "
        f"= {p1['controller_kib_per_queued_job']} KiB/job"
    )
    print(
        f"  workers welcomed in {p1['all_workers_welcomed_s']} s; queue drained in {p1['drain_s']} s "
        f"({p1['drain_jobs_per_s']} jobs/s); assignment sizes {p1['assignment_sizes']}"
    )
    lat = p2["dispatch_latency"]
    print(
        f"burst: submit {p2['submit']['per_s']}/s; dispatch latency p50 {lat['p50_ms']} ms, "
        f"p99 {lat['p99_ms']} ms, max {lat['max_ms']} ms; drained in {p2['drain_s']} s "
        f"({p2['drain_jobs_per_s']} jobs/s); assignment sizes {p2['assignment_sizes']}"
    )
    print(
        f"CPU (cores) submit {p1['submit_cpu_cores']}, drain {p1['drain_cpu_cores']}, burst {p2['cpu_cores']}"
    )
    print(f"controller VmHWM {report['controller_vm_hwm_mib']} MiB; reconnects {p2['reconnects']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_benchmark(
        lambda log_dir: run(args, log_dir),
        print_report,
        args.json,
        (TimeoutError, RuntimeError, ConnectionError),
        3000,
    )


if __name__ == "__main__":
    sys.exit(main())
