"""`omnirtctl generate`: submit a request, follow it with a progress bar, write its files."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omnirt.cli.output import print_json, report_line
from omnirt.cli.progress import Finished, follow, show_progress
from omnirt.cli.request_args import add_request_arguments, request_from_args
from omnirt.client import Client

# Past the request's own timeout, give the controller this long to report it before the
# client gives up by itself (the controller's error says more).
TIMEOUT_GRACE_S = 5.0


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "generate",
        parents=[common],
        help="run a generation and save its outputs",
        description="Submit a request, show its progress, and write the outputs into --out.",
    )
    add_request_arguments(parser)
    parser.add_argument("--out", "-o", type=Path, default=Path("outputs"), help="folder (default: ./outputs)")
    parser.add_argument(
        "--detach", "--no-wait", action="store_true", help="print the job id (or job JSON) and return at once"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, client: Client) -> int:
    started = time.monotonic()
    job = client.submit(request_from_args(args))
    if args.detach:
        if args.json:
            print_json(job)
        else:
            print(job.id)
        return 0
    wait_s = None if args.timeout is None else args.timeout + TIMEOUT_GRACE_S
    try:
        done = follow(
            client, job, out=args.out, timeout=wait_s, bar=show_progress(args.json), started=started
        )
    except KeyboardInterrupt:
        # Ctrl-C means "stop": do not leave the job running for nobody.
        cancelled = client.cancel(job.id).cancelled
        note = f"cancelled job {job.id}" if cancelled else f"job {job.id} had already finished"
        print(f"error: interrupted; {note}", file=sys.stderr)
        return 130
    print_finished(done, json_output=args.json)
    return 0


def print_finished(done: Finished, *, json_output: bool) -> None:
    """The written files and the report line (or one JSON object)."""
    result = done.result
    if json_output:
        print_json(
            {
                "job_id": result.job_id,
                "state": "succeeded",
                "files": [str(p) for p in done.files],
                "elapsed_s": round(done.elapsed_s, 3),
                "artifacts": result.artifacts,
                "report": result.report,
            }
        )
        return
    for path in done.files:
        print(path)
    print(report_line(result, done.elapsed_s))
    for warning in result.report.warnings:
        print(f"warning: {warning}", file=sys.stderr)
