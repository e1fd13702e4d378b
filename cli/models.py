"""`omnirtctl models list | describe | load | unload`: the controller's catalog, and warming or
freeing a model on the workers (load and unload need an admin key when API keys are on)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from omnirt.cli.output import fmt_ms, fmt_value, print_fields, print_json, print_table
from omnirt.client import Client
from omnirt.types import ModelOutcome, ModelSpec, Task


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("models", help="the model catalog")
    sub = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    ls = sub.add_parser("list", parents=[common], help="list models")
    ls.add_argument("--task", "-t", choices=[t.value for t in Task], help="only models that do this task")
    ls.add_argument("--served", action="store_true", help="only models a connected worker serves")
    ls.set_defaults(handler=run_list)
    describe = sub.add_parser("describe", parents=[common], help="show one model")
    describe.add_argument("name", help="model id or alias")
    describe.set_defaults(handler=run_describe)
    load = sub.add_parser(
        "load", parents=[common], help="make a model warm on workers and wait for the loads (admin)"
    )
    load.add_argument("name", help="model id or alias")
    load.add_argument(
        "--workers", "-n", type=int, default=0, metavar="N",
        help="how many workers should hold it warm, those warm already included (default: all that can)",
    )  # fmt: skip
    load.add_argument(
        "--worker", "-w", action="append", default=[], metavar="ID", help="only this worker (repeatable)"
    )
    load.add_argument("--timeout", type=float, metavar="SECONDS", help="give up waiting after this long")
    load.set_defaults(handler=run_load)
    unload = sub.add_parser(
        "unload", parents=[common], help="free a model on workers once its running jobs end (admin)"
    )
    unload.add_argument("name", help="model id or alias")
    unload.add_argument(
        "--worker", "-w", action="append", default=[], metavar="ID",
        help="only this worker (repeatable; default: every worker that serves it)",
    )  # fmt: skip
    unload.add_argument("--timeout", type=float, metavar="SECONDS", help="give up waiting after this long")
    unload.set_defaults(handler=run_unload)


def run_load(args: argparse.Namespace, client: Client) -> int:
    if args.workers < 0:
        raise SystemExit("omnirtctl: --workers must be 0 or more")
    outcomes = client.load_model(
        args.name, workers=args.workers, worker_ids=args.worker, timeout=args.timeout
    )
    return _print_outcomes(args, outcomes, "loaded", "warm already")


def run_unload(args: argparse.Namespace, client: Client) -> int:
    outcomes = client.unload_model(args.name, worker_ids=args.worker, timeout=args.timeout)
    if not outcomes and not args.json:
        print(f"no connected worker serves model {args.name}")
        return 0
    return _print_outcomes(args, outcomes, "unloaded", "not loaded")


def _print_outcomes(args: argparse.Namespace, outcomes: list[ModelOutcome], done: str, unchanged: str) -> int:
    """One row per worker; exit status 1 when any worker did not do what was asked."""
    if args.json:
        print_json(outcomes)
    else:
        rows = []
        for o in outcomes:
            if o.error is not None:
                what = f"failed: {o.error.code} {o.error.message}"
            else:
                what = unchanged if o.unchanged else done
            memory = f"{o.memory_bytes / 1e6:.1f} MB" if o.memory_bytes else "-"
            rows.append((o.worker_id, what, fmt_ms(o.load_ms) if o.load_ms else "-", memory))
        print_table(("WORKER", "OUTCOME", "LOAD", "MEMORY"), rows, empty="no workers")
    return 1 if any(o.error is not None for o in outcomes) else 0


def run_list(args: argparse.Namespace, client: Client) -> int:
    models = client.list_models(args.task)
    if args.served:
        models = [m for m in models if m.serving_workers]
    if args.json:
        print_json(models)
        return 0
    rows = [
        (
            m.id,
            m.family,
            [t.value for t in m.tasks],
            m.execution_mode,
            m.serving_workers,
            m.aliases,
        )
        for m in models
    ]
    empty = "no connected worker serves a model" if args.served else "no models"
    print_table(("ID", "FAMILY", "TASKS", "MODE", "WORKERS", "ALIASES"), rows, empty=empty)
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
            ("warm on", _warm_on(spec)),
            ("defaults", _nonzero(spec.defaults)),
            ("limits", _nonzero(spec.limits)),
            ("presets", presets),
            ("runtime", spec.runtime),
        ]
    )
    return 0


def _fmt(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={fmt_value(v)}" for k, v in values.items())


def _warm_on(spec: ModelSpec) -> list[str]:
    """`w1 (4.4 MB)` for each worker holding the model loaded (its size when measured)."""
    return [f"{w} ({n / 1e6:.1f} MB)" if n else w for w, n in sorted(spec.warm_on.items())]
