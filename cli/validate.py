"""`omnirtctl validate`: resolve a request into its execution plan without running it."""

from __future__ import annotations

import argparse
import sys

from omnirt.cli.output import fmt_value, print_fields, print_json
from omnirt.cli.request_args import add_request_arguments, request_from_args
from omnirt.client import Client


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "validate",
        parents=[common],
        help="check a request and show what it resolves to",
        description="Resolve a request (model, task, defaults, presets) without running it.",
    )
    add_request_arguments(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, client: Client) -> int:
    plan = client.validate(request_from_args(args))
    if args.json:
        print_json(plan)
        return 0
    print_fields([("model", plan.model), ("task", plan.task), ("execution mode", plan.execution_mode)])
    print("config:")
    for key in sorted(plan.config_resolved):
        print(f"  {key}: {fmt_value(plan.config_resolved[key])}")
    for warning in plan.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
