"""`omnirtctl bench`: a closed-loop load against a running controller, and what it measured.

The load is one request built from the same flags as `generate`, or the requests of a
`--request-file` used round robin. It is always bounded: `--total` requests (default 100) and
`--duration` seconds (default 600) for the measured part, the same limit again for the warmup.
Failed requests are measured data, so the command exits 0 once the bench ran; it fails only
on its own errors (bad flags or request file: 2; the controller unreachable at start: 1).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from omnirt.cli import connection
from omnirt.cli.bench_stats import Sample
from omnirt.cli.output import print_fields, print_json, print_table
from omnirt.cli.progress import show_progress
from omnirt.cli.request_args import add_request_arguments, request_from_args
from omnirt.client import Client
from omnirt.errors import OmniRTError
from omnirt.types import GenerateRequest

DEFAULT_TOTAL = 100
DEFAULT_DURATION_S = 600.0
DEFAULT_GRACE_S = 10.0


def _count(minimum: int) -> Any:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum} (got {number})")
        return number

    return parse


def _seconds(*, positive: bool) -> Any:
    def parse(value: str) -> float:
        try:
            seconds = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {value!r}") from None
        if not seconds < float("inf") or seconds < 0 or (positive and seconds == 0):
            raise argparse.ArgumentTypeError(
                f"must be {'positive' if positive else 'zero or more'} (got {value})"
            )
        return seconds

    return parse


def _request_dests() -> set[str]:
    """The argparse names of the request flags (to tell whether any was given)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_request_arguments(probe)
    return set(vars(probe.parse_args(["--model", "-"])))


REQUEST_DESTS = _request_dests()


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "bench",
        parents=[common],
        help="measure throughput and latency under a closed-loop load",
        description=(
            "Send a request (from the request flags) or the requests of --request-file, "
            "--concurrency at a time, and report throughput, latency, time to first progress, "
            "queue wait, batching and failures. Bounded by --total and --duration."
        ),
    )
    # --request-file can stand in for the request flags, --model included.
    add_request_arguments(parser, model_required=False)
    g = parser.add_argument_group("load")
    g.add_argument(
        "--request-file",
        type=Path,
        metavar="FILE",
        help="a JSON GenerateRequest, a JSON array or JSON Lines of them (used round robin)",
    )
    g.add_argument(
        "--concurrency", type=_count(1), default=1, metavar="N", help="requests in flight (default 1)"
    )
    g.add_argument(
        "--total",
        type=_count(1),
        default=DEFAULT_TOTAL,
        metavar="N",
        help=f"measured requests (default {DEFAULT_TOTAL})",
    )
    g.add_argument(
        "--warmup",
        type=_count(0),
        default=0,
        metavar="N",
        help="requests sent first and not counted (default 0)",
    )
    g.add_argument(
        "--duration",
        type=_seconds(positive=True),
        default=DEFAULT_DURATION_S,
        metavar="SECONDS",
        help=f"stop sending after this long (default {DEFAULT_DURATION_S:g}); the warmup has the same limit",
    )
    g.add_argument(
        "--grace",
        type=_seconds(positive=False),
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help=(
            "after --duration, wait this long for the requests in flight, then cancel them"
            f" (default {DEFAULT_GRACE_S:g})"
        ),
    )
    parser.set_defaults(handler=run)


def _requests(args: argparse.Namespace) -> list[GenerateRequest] | str:
    """The requests of the load, or the one-line reason the flags do not make one."""
    from omnirt.cli.bench_requests import RequestFileError, load_requests

    if args.request_file is None:
        if args.model is None:
            return "give --model (and the other request flags) or --request-file"
        return [request_from_args(args)]
    given = sorted(d for d in REQUEST_DESTS if getattr(args, d, None) is not None)
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        return f"--request-file replaces the request flags (got {flags})"
    try:
        return load_requests(args.request_file)
    except RequestFileError as exc:
        return f"--request-file {args.request_file}: {exc}"


def run(args: argparse.Namespace, client: Client) -> int:
    requests = _requests(args)
    if isinstance(requests, str):
        print(f"error: {requests}", file=sys.stderr)
        return 2
    # Fail fast, with the SDK's one-line error, when the controller cannot be reached at all.
    client.list_workers()
    for warning in unserved_models(client, requests):
        print(f"warning: {warning}", file=sys.stderr)
    result = asyncio.run(_bench(client, requests, args))
    if args.json:
        print_json(result)
    else:
        print_report(result)
    return 0


def unserved_models(client: Client, requests: list[GenerateRequest]) -> list[str]:
    """A warning per catalog model no connected worker serves (its jobs would wait out the limit).

    Unknown models say nothing here: their NOT_FOUND is measured like any failure."""
    warnings = []
    for model in sorted({r.model for r in requests}):
        try:
            spec = client.describe_model(model)
        except OmniRTError:
            continue
        if spec.serving_workers == 0:
            warnings.append(
                f"no connected worker serves {model}; its jobs wait in the queue until --duration"
            )
    return warnings


async def _bench(client: Client, requests: list[GenerateRequest], args: argparse.Namespace) -> dict[str, Any]:
    from omnirt.aio import AsyncClient
    from omnirt.cli.bench_load import run_phase
    from omnirt.cli.bench_stats import bench_report

    limits = {"concurrency": args.concurrency, "limit_s": args.duration, "grace_s": args.grace}
    settings = connection.client_settings(args)
    async with AsyncClient(client.address, metadata=client.metadata, **settings) as aio:
        with LoadBar(enabled=show_progress(args.json)) as bar:
            bar.start("warmup", args.warmup)
            warm = await run_phase(aio, requests, count=args.warmup, on_sample=bar.advance, **limits)
            bar.start("bench", args.total)
            measured = await run_phase(aio, requests, count=args.total, on_sample=bar.advance, **limits)
    report = bench_report(
        measured.samples, planned=args.total, wall_s=measured.wall_s, stopped_by=measured.stopped_by
    )
    return {
        "controller": client.address,
        "models": sorted({r.model for r in requests}),
        "request_variants": len(requests),
        "concurrency": args.concurrency,
        "duration_limit_s": args.duration,
        "grace_s": args.grace,
        "warmup": {
            "planned": args.warmup,
            "total": len(warm.samples),
            "ok": sum(s.ok for s in warm.samples),
            "stopped_by": warm.stopped_by,
        },
        **report,
        "cancelled_jobs": warm.cancelled_jobs + measured.cancelled_jobs,
    }


class LoadBar:
    """A rich bar of finished requests (ok / failed) on stderr; does nothing when disabled."""

    def __init__(self, *, enabled: bool) -> None:
        self.bar: Any = None
        self.task_id: Any = None
        self.ok = self.failed = 0
        if not enabled:
            return
        # rich loads only when a bar is shown, as in progress.py.
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=True,
        )

    def __enter__(self) -> LoadBar:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(
        self, typ: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.bar is not None:
            self.bar.stop()

    def start(self, name: str, total: int) -> None:
        """A new phase of `total` requests (a phase of none shows nothing)."""
        self.ok = self.failed = 0
        if self.bar is None or total <= 0:
            return
        if self.task_id is not None:
            self.bar.remove_task(self.task_id)
        self.task_id = self.bar.add_task(name, total=total, counts="")

    def advance(self, sample: Sample) -> None:
        """One request ended."""
        self.ok += sample.ok
        self.failed += not sample.ok
        if self.bar is not None and self.task_id is not None:
            self.bar.update(self.task_id, advance=1, counts=f"ok {self.ok} · failed {self.failed}")


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return (
        f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms" if value < 1000 else f"{value / 1000:.2f} s"
    )


def print_report(result: dict[str, Any]) -> None:
    """The report as text: a block of totals, then one row of percentiles per measure."""
    warm = result["warmup"]
    failures, examples = result["failures"], result["failure_examples"]
    mean_batch, share = result["batch_size_mean"], result["batched_share"]
    print_fields(
        [
            ("models", result["models"]),
            ("concurrency", result["concurrency"]),
            (
                "requests",
                f"{result['total']} sent · {result['ok']} ok · {result['failed']} failed"
                f" · {result['not_sent']} not sent (of {result['planned']})",
            ),
            ("warmup", f"{warm['ok']} ok of {warm['total']}" if warm["planned"] else ""),
            ("stopped by", "--total reached" if result["stopped_by"] == "total" else "--duration limit"),
            ("wall time", f"{result['wall_s']:.2f} s"),
            ("throughput", f"{result['throughput_per_s']:.2f} ok requests/s"),
            (
                "batching",
                f"mean batch {mean_batch:.2f} · {share:.0%} of requests batched"
                if mean_batch is not None
                else "",
            ),
            ("cold starts", result["cold_starts"]),
            ("failures", [f"{code}: {n} ({examples[code]})" for code, n in failures.items()] or "none"),
            (
                "cancelled",
                f"{result['cancelled_jobs']} jobs at the time limit" if result["cancelled_jobs"] else "",
            ),
        ]
    )
    print()
    rows = [
        ("latency", result["latency_ms"]),
        ("first progress", result["ttfp_ms"]),
        ("queue wait", result["queue_wait_ms"]),
        ("execution", result["execution_ms"]),
    ]
    print_table(
        ["", "p50", "p95", "p99", "mean", "max", "n"],
        [
            [name, _ms(d["p50"]), _ms(d["p95"]), _ms(d["p99"]), _ms(d["mean"]), _ms(d["max"]), d["count"]]
            for name, d in rows
        ],
    )
