"""`omnirtctl validate`: resolve a request into its execution plan without running it."""

from __future__ import annotations

import argparse
import sys

from omnirt import original
from omnirt.cli.output import fmt_value, print_fields, print_json
from omnirt.cli.request_args import (
    add_request_arguments,
    request_from_args,
    request_source_problem,
    usage_error,
)
from omnirt.client import Client


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "validate",
        parents=[common],
        help="check a request and show what it resolves to",
        description=(
            "Resolve a request (model, task, defaults, presets) without running it. With --config, "
            "the original OmniRT's request file, answered as the original did (--json: ok, issues, ...)."
        ),
    )
    add_request_arguments(parser, config=True)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, client: Client) -> int:
    problem = request_source_problem(args)
    if problem:
        return usage_error(problem, json_output=args.json)
    if args.config is not None:
        return _run_original(args, client)
    plan = client.validate(request_from_args(args))
    if args.json:
        print_json(plan)
        return 0
    _print_plan(plan.model, plan.task, plan.execution_mode, plan.config_resolved, plan.warnings)
    return 0


def _run_original(args: argparse.Namespace, client: Client) -> int:
    """The original's request file: its ValidationResult; status 1 when it is not ok."""
    found = original.validate(client, args.config, timeout=args.timeout)
    if args.json:
        print_json(found.to_dict())
    elif found.ok and found.model_spec is not None:
        spec = found.model_spec
        warnings = [i.message for i in found.warnings]
        _print_plan(spec.id, spec.task, spec.execution_mode, found.resolved_config, warnings)
    else:
        for issue in found.issues:
            print(f"{issue.level}: {issue.message}", file=sys.stderr)
    return 0 if found.ok else 1


def _print_plan(model: str, task: object, mode: str, config: dict[str, object], warnings: list[str]) -> None:
    print_fields([("model", model), ("task", task), ("execution mode", mode)])
    print("config:")
    for key in sorted(config):
        print(f"  {key}: {fmt_value(config[key])}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
