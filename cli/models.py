"""`omnirtctl models list | describe | load | unload`: the controller's catalog, and warming or
freeing a model on the workers (load and unload need an admin key when API keys are on)."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from omnirt._internal.jsonable import to_jsonable
from omnirt.cli.output import fmt_ms, fmt_value, print_fields, print_json, print_table
from omnirt.client import Client
from omnirt.types import ModelOutcome, ModelSpec, Task

# The model ids of the original OmniRT's registry (datascale-ai/omnirt; 60 ids and the alias
# flux2-dev), for `models list --original`: the catalog serves most of them as aliases of its
# entries, which are all a client sees of them (tests/fixtures/original_registry_ids.json holds
# the list and the catalog to each other; docs/migrating.md).
ORIGINAL_IDS = frozenset({
    "animate-diff-sdxl", "bria-3.2", "chronoedit", "cogvideox-2b", "cogvideox-5b",
    "cosyvoice3-triton-trtllm", "flux-canny", "flux-depth", "flux-dev", "flux-fill", "flux-kontext",
    "flux-schnell", "flux2-dev", "flux2.dev", "glm-image", "helios-i2v", "helios-t2v", "hidream-i1",
    "hunyuan-image-2.1", "hunyuan-video", "hunyuan-video-1.5-i2v", "hunyuan-video-1.5-t2v", "indextts",
    "kandinsky5-i2v", "kandinsky5-t2v", "kolors", "longcat-video-avatar-1.5", "ltx-video", "ltx2-i2v",
    "lumina-t2x", "mochi", "omnigen", "ovis-image", "pixart-sigma", "qwen-image", "qwen-image-edit",
    "qwen-image-edit-plus", "qwen-image-layered", "sana-1.6b", "sana-video", "sd15", "sd21",
    "sd3-medium", "sd3.5-large", "sd3.5-large-turbo", "sdxl-base-1.0", "sdxl-refiner-1.0", "sdxl-turbo",
    "sensevoice-small", "skyreels-v2", "soulx-flashhead-1.3b", "soulx-flashtalk-14b",
    "soulx-liveact-14b", "soulx-podcast-1.7b", "svd", "svd-xt", "vllm-omni-speech", "wan2.1-i2v-14b",
    "wan2.1-t2v-14b", "wan2.2-i2v-14b", "wan2.2-t2v-14b"
})  # fmt: skip


def register(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser("models", help="the model catalog")
    sub = parser.add_subparsers(dest="models_command", metavar="COMMAND", required=True)
    ls = sub.add_parser("list", parents=[common], help="list models")
    ls.add_argument("--task", "-t", choices=[t.value for t in Task], help="only models that do this task")
    ls.add_argument("--served", action="store_true", help="only models a connected worker serves")
    ls.add_argument(
        "--original", action="store_true",
        help="add the model ids of the original OmniRT that each model answers to (docs/migrating.md)",
    )  # fmt: skip
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
        if args.original:
            print_json([{**to_jsonable(m), "original_ids": original_ids(m)} for m in models])
        else:
            print_json(models)
        return 0
    original = ["ORIGINAL"] if args.original else []  # beside our id
    header = ["ID", *original, "FAMILY", "TASKS", "MODE", "WORKERS", "ALIASES"]
    rows = [
        [
            m.id,
            *([original_ids(m)] if args.original else []),
            m.family,
            [t.value for t in m.tasks],
            m.execution_mode,
            m.serving_workers,
            m.aliases,
        ]
        for m in models
    ]
    empty = "no connected worker serves a model" if args.served else "no models"
    print_table(header, rows, empty=empty)
    return 0


def original_ids(spec: ModelSpec) -> list[str]:
    """The original OmniRT's ids that name `spec` here: its own id, or aliases of it."""
    return [name for name in (spec.id, *spec.aliases) if name in ORIGINAL_IDS]


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
