"""`omnirtctl`: the command line of OmniRT, a thin layer over the SDK.

`main(argv)` returns the exit status: 0 on success, 1 on an error (one `error: ...` line on
stderr; with --json also `{"error": {...}}` on stdout), 2 on a usage error, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from omnirt import __version__
from omnirt.cli import bench, connection, generate, jobs, keys, models, sessions, validate, webhooks, workers
from omnirt.cli.output import error_object, print_error, print_json
from omnirt.errors import OmniRTError

GROUPS = (generate, validate, bench, models, jobs, workers, sessions, webhooks, keys)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are also one JSON line on stdout under --json
    (subcommands' parsers are of the same class: argparse builds them from the top one's)."""

    json_errors = False  # set by `main` when --json is on the command line

    def error(self, message: str) -> NoReturn:
        if Parser.json_errors:
            print_json(error_object("INVALID_ARGUMENT", f"{self.prog}: {message}"), compact=True)
        super().error(message)


def _common(*, top: bool) -> argparse.ArgumentParser:
    """--controller, --json, TLS and the API key.

    On subcommands they default to SUPPRESS so the top level's win."""
    parser = argparse.ArgumentParser(add_help=False)
    default_controller = os.environ.get("OMNIRT_CONTROLLER") if top else argparse.SUPPRESS
    parser.add_argument(
        "--controller",
        "-c",
        metavar="ADDRESS",
        default=default_controller,
        help="controller address host:port (default: $OMNIRT_CONTROLLER, else 127.0.0.1:50051)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON for machines instead of text",
    )
    connection.add_options(parser, top=top)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The whole command line."""
    parser = Parser(
        prog="omnirtctl",
        parents=[_common(top=True)],
        description="Run generations on an OmniRT controller and inspect its jobs, models and workers.",
    )
    parser.add_argument("--version", action="version", version=f"omnirtctl {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _common(top=False)
    for group in GROUPS:
        group.register(subparsers, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: sys.argv[1:]), run the command, and return the exit status."""
    parser = build_parser()
    Parser.json_errors = "--json" in (sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else 0
    from omnirt.client import Client  # grpc loads only for a real command, not for --help

    json_output = bool(getattr(args, "json", False))
    try:
        client = Client(args.controller, **connection.client_settings(args))
    except (ValueError, OSError) as exc:  # a usage error: a CA file missing or not PEM, a bad key
        message = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) and exc.filename else str(exc)
        print(f"error: {message}", file=sys.stderr)
        if json_output:
            print_json(error_object("INVALID_ARGUMENT", message), compact=True)
        return 2
    try:
        with client:
            status: int = args.handler(args, client)
            return status
    except OmniRTError as exc:
        print_error(exc, json_output=json_output)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and keep Python from complaining at exit.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 1
    except OSError as exc:
        message = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc)
        print(f"error: {message}", file=sys.stderr)
        if json_output:
            print_json(error_object("OS_ERROR", message), compact=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
