"""`omnirtctl generate`: submit a request, follow it with a progress bar, write its files.

With `--config FILE` the request is the original OmniRT's request file; its files go into
--out, else its `config.output_dir`, else ./outputs, and `--json` prints the original's
`{"outputs", "metadata"}` (what `omnirt.generate(FILE).to_dict()` gives).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from omnirt import original
from omnirt._internal.original import error_to_original as original_errors
from omnirt.cli import validate
from omnirt.cli.output import print_json, report_line
from omnirt.cli.progress import Finished, follow, show_progress
from omnirt.cli.request_args import (
    add_request_arguments,
    request_from_args,
    request_source_problem,
    usage_error,
)
from omnirt.client import Client
from omnirt.errors import OmniRTError
from omnirt.types import GenerateRequest

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
    add_request_arguments(parser, config=True)
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        help="folder (default: ./outputs; with --config the file's config.output_dir, else ./outputs)",
    )
    parser.add_argument(
        "--detach", "--no-wait", action="store_true", help="print the job id (or job JSON) and return at once"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="only check the request and show its plan (as `validate`)"
    )
    parser.set_defaults(handler=run)


def _request(args: argparse.Namespace) -> tuple[GenerateRequest, Path]:
    """The request and the folder its files go to."""
    if args.config is None:
        return request_from_args(args), args.out or Path(original.DEFAULT_OUTPUT_DIR)
    request, _, _ = original.prepare(args.config)
    if args.timeout:
        request.timeout_ms = round(args.timeout * 1000)
    return request, original.output_folder(args.config, args.out)


def run(args: argparse.Namespace, client: Client) -> int:
    try:
        return _run(args, client)
    except OmniRTError as exc:
        if args.config is None:
            raise
        # The fields at fault as the original's file names them (`config.width`).
        raise original_errors(exc, args.config) from None


def _run(args: argparse.Namespace, client: Client) -> int:
    started = time.monotonic()
    problem = request_source_problem(args)
    if problem:
        return usage_error(problem, json_output=args.json)
    if args.dry_run:
        return validate.run(args, client)
    request, out = _request(args)
    job = client.submit(request)
    if args.detach:
        if args.json:
            print_json(job)
        else:
            print(job.id)
        return 0
    wait_s = None if args.timeout is None else args.timeout + TIMEOUT_GRACE_S
    try:
        done = follow(client, job, out=out, timeout=wait_s, bar=show_progress(args.json), started=started)
    except KeyboardInterrupt:
        # Ctrl-C means "stop": do not leave the job running for nobody.
        cancelled = client.cancel(job.id).cancelled
        note = f"cancelled job {job.id}" if cancelled else f"job {job.id} had already finished"
        print(f"error: interrupted; {note}", file=sys.stderr)
        return 130
    if args.config is not None and args.json:
        print_json(original.result_of(done.result, done.files, args.config).to_dict())
        return 0
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
