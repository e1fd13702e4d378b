"""`omnirtctl models list | describe`: the controller's catalog."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from omnirt.cli.output import fmt_value, print_fields, print_json, print_table
from omnirt.client import Client
from omnirt.types import ModelSpec, Task


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("models", help="the model catalog")
    sub = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    ls = sub.add_parser("list", parents=[common], help="list models")
    ls.add_argument("--task", "-t", choices=[t.value for t in Task], help="only models that do this task")
    ls.set_defaults(handler=run_list)
    describe = sub.add_parser("describe", parents=[common], help="show one model")
    describe.add_argument("name", help="model id or alias")
    describe.set_defaults(handler=run_describe)


def run_list(args: argparse.Namespace, client: Client) -> int:
    models = client.list_models(args.task)
    if args.json:
        print_json(models)
        return 0
    rows = [
        (m.id, m.family, [t.value for t in m.tasks], m.execution_mode, m.serving_workers, m.aliases)
        for m in models
    ]
    print_table(("ID", "FAMILY", "TASKS", "MODE", "WORKERS", "ALIASES"), rows, empty="no models")
    return 0


def _nonzero(values: Any) -> dict[str, Any]:
    return {k: v for k, v in asdict(values).items() if v}


def run_describe(args: argparse.Namespace, client: Client) -> int:
    spec: ModelSpec = client.describe_model(args.name)
    if args.json:
        print_json(spec)
        return 0
    batching = "no"
    if spec.supports_batching:
        batching = f"yes (max {spec.limits.max_batch_size})" if spec.limits.max_batch_size else "yes"
    presets = [
        f"{p.name}: {p.description}" + (f" ({_fmt(p.overrides)})" if p.overrides else "")
        for p in spec.presets
    ]
    print_fields(
        [
            ("id", spec.id),
            ("aliases", spec.aliases),
            ("family", spec.family),
            ("tasks", ", ".join(t.value for t in spec.tasks)),
            ("execution mode", spec.execution_mode),
            ("source", spec.source),
            ("pipeline class", spec.pipeline_class),
            ("description", spec.description),
            ("batching", batching),
            ("workers", str(spec.serving_workers)),
            ("defaults", _nonzero(spec.defaults)),
            ("limits", _nonzero(spec.limits)),
            ("presets", presets),
            ("runtime", spec.runtime),
        ]
    )
    return 0


def _fmt(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={fmt_value(v)}" for k, v in values.items())
