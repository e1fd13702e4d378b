"""`omnirtctl workers list | drain`: the workers connected to the controller."""

from __future__ import annotations

import argparse

from omnirt.cli.output import fmt_time, print_fields, print_json, print_table
from omnirt.client import Client
from omnirt.types import WorkerInfo


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("workers", help="connected workers")
    sub = parser.add_subparsers(dest="workers_command", metavar="COMMAND", required=True)
    sub.add_parser("list", parents=[common], help="list workers").set_defaults(handler=run_list)
    drain = sub.add_parser("drain", parents=[common], help="finish running jobs, take no new ones, stop")
    drain.add_argument("worker_id")
    drain.set_defaults(handler=run_drain)


def _models(worker: WorkerInfo) -> str:
    # A `*` marks models the worker holds loaded (warm), a `!` models the catalog lacks.
    marks = {m: "*" for m in worker.loaded_models} | {m: "!" for m in worker.unknown_models}
    return ", ".join(m + marks.get(m, "") for m in worker.models) or "-"


def run_list(args: argparse.Namespace, client: Client) -> int:
    workers = client.list_workers()
    if args.json:
        print_json(workers)
        return 0
    rows = [
        (
            w.id,
            w.state,
            w.execution_mode,
            w.backend,
            w.device or "-",
            f"{w.busy_slots}/{w.slots}",
            # Since the worker process started, as it counts them (cancelled jobs are neither).
            f"{w.jobs_succeeded}/{w.jobs_failed}",
            _models(w),
            w.hostname,
            fmt_time(w.last_heartbeat_at),
        )
        for w in workers
    ]
    header = (
        "ID",
        "STATE",
        "MODE",
        "BACKEND",
        "DEVICE",
        "BUSY",
        "DONE/FAILED",
        "MODELS (*loaded, !unknown)",
        "HOST",
        "HEARTBEAT",
    )
    print_table(header, rows, empty="no workers connected")
    return 0


def run_drain(args: argparse.Namespace, client: Client) -> int:
    worker = client.drain_worker(args.worker_id)
    if args.json:
        print_json(worker)
        return 0
    print_fields([("id", worker.id), ("state", worker.state), ("running", worker.running_job_ids)])
    return 0
