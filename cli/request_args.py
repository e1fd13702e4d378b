"""The request flags shared by `generate` and `validate`, and the request they build.

`--config FILE` stands in for the request flags with the original OmniRT's request file
(YAML or JSON: `task`, `model`, `backend`, `inputs`, `config`), read by `omnirt.original`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from omnirt._internal.requests import build_request
from omnirt.cli.output import error_object, print_json
from omnirt.requests import load_request_file
from omnirt.types import Adapter, GenerateRequest, Task


def _file(value: str) -> Path:
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path


def _json_object(value: str) -> dict[str, Any]:
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return data


def _label(value: str) -> tuple[str, str]:
    key, sep, val = value.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (got {value!r})")
    return key, val


def _adapter(value: str) -> Adapter:
    name, sep, scale = value.rpartition(":")
    if sep and name:
        try:
            return Adapter(name=name, scale=float(scale))
        except ValueError:
            pass  # a colon in the name (a path), no scale
    return Adapter(name=value)


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive (got {value})")
    return seconds


def _request_file(value: str) -> dict[str, Any]:
    """The original's request file, read at parse time: a bad one is a usage error."""
    try:
        return load_request_file(value)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {value}: {exc.strerror or exc}") from None
    except (ValueError, ModuleNotFoundError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def request_source_problem(args: argparse.Namespace) -> str | None:
    """Why the flags name no request (or two), else None: --model, or --config alone."""
    if getattr(args, "config", None) is None:
        return None if args.model is not None else "give --model (and the other request flags) or --config"
    given = sorted(d for d in REQUEST_DESTS - {"timeout"} if getattr(args, d, None) is not None)
    if given:
        flags = ", ".join("--" + d.replace("_", "-") for d in given)
        return f"--config replaces the request flags (got {flags})"
    return None


def usage_error(message: str, *, json_output: bool) -> int:
    """A usage error found after parsing: its line (and --json object), and the status 2."""
    print(f"error: {message}", file=sys.stderr)
    if json_output:
        print_json(error_object("INVALID_ARGUMENT", message), compact=True)
    return 2


def add_request_arguments(
    parser: argparse.ArgumentParser, *, model_required: bool = True, config: bool = False
) -> None:
    """Flags for every field of a `GenerateRequest` people set by hand.

    `config`: `--config FILE` too, the original OmniRT's request file, given instead of
    `--model` (one of the two is required; see `request_source_problem` for the other flags).
    """
    g = parser.add_argument_group("request")
    model_help = "model id or alias from the catalog"
    if config:
        source = g.add_mutually_exclusive_group(required=True)
        source.add_argument("--model", "-m", help=model_help)
        source.add_argument(
            "--config",
            type=_request_file,
            metavar="FILE",
            help="the original OmniRT's request file (YAML; JSON if named *.json) for the request flags",
        )
    else:
        g.add_argument("--model", "-m", required=model_required, help=model_help)
    g.add_argument("--prompt", "-p", help="what to generate")
    g.add_argument("--task", "-t", choices=[t.value for t in Task], help="default: the model's first task")
    g.add_argument("--negative-prompt", help="what to avoid")
    g.add_argument("--width", type=int)
    g.add_argument("--height", type=int)
    g.add_argument("--num-frames", type=int, help="video length in frames")
    g.add_argument("--fps", type=float)
    g.add_argument("--steps", dest="num_inference_steps", type=int, metavar="N", help="denoising steps")
    g.add_argument(
        "--guidance",
        dest="guidance_scale",
        type=float,
        metavar="SCALE",
        help="classifier-free guidance scale",
    )
    g.add_argument("--seed", type=int, help="seed of output 0 (output i uses seed + i)")
    g.add_argument("--num-outputs", "-n", type=int)
    g.add_argument("--strength", type=float, help="image2image / inpaint strength in (0, 1]")
    g.add_argument("--duration-ms", type=int, help="audio length for text2audio")
    g.add_argument("--preset", help="fast, balanced, quality, low-vram or a model's own")
    g.add_argument("--scheduler", help="scheduler class name")
    g.add_argument("--adapter", dest="adapters", action="append", type=_adapter, metavar="NAME[:SCALE]")
    g.add_argument("--priority", type=int, help="0..100, higher runs first")
    g.add_argument("--timeout", type=_positive_seconds, metavar="SECONDS", help="give up after this long")
    g.add_argument("--image", type=_file, metavar="FILE", help="input image (image2image, inpaint, ...)")
    g.add_argument("--mask", type=_file, metavar="FILE", help="inpainting mask (white is repainted)")
    g.add_argument("--audio", type=_file, metavar="FILE", help="driving audio (audio2video)")
    g.add_argument("--extra", type=_json_object, metavar="JSON", help="model-specific extras, a JSON object")
    g.add_argument("--label", dest="labels", action="append", type=_label, metavar="KEY=VALUE")
    g.add_argument("--idempotency-key", metavar="KEY", help="the same key returns the same job")
    g.add_argument("--format", dest="output_format", metavar="FORMAT", help="png, webp, jpeg, mp4, gif, wav")
    g.add_argument("--quality", type=int, help="quality of lossy formats, 1-100")
    g.add_argument("--webhook", metavar="URL", help="POST the job's events to this URL (signed)")
    g.add_argument(
        "--webhook-events",
        type=lambda v: [x.strip() for x in v.split(",") if x.strip()],
        metavar="LIST",
        help="queued,started,progress,completed,failed,cancelled (default: all)",
    )


def request_from_args(args: argparse.Namespace) -> GenerateRequest:
    """The `GenerateRequest` the flags describe (unset flags stay unset)."""
    timeout: float | None = args.timeout
    return build_request(
        model=args.model,
        task=args.task,
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        width=args.width,
        height=args.height,
        num_frames=args.num_frames,
        fps=args.fps,
        num_inference_steps=args.num_inference_steps,
        guidance_scale=args.guidance_scale,
        seed=args.seed,
        num_outputs=args.num_outputs,
        strength=args.strength,
        duration_ms=args.duration_ms,
        preset=args.preset,
        scheduler=args.scheduler,
        adapters=args.adapters,
        priority=args.priority,
        timeout_ms=round(timeout * 1000) if timeout else None,
        image=args.image,
        mask=args.mask,
        audio=args.audio,
        extra=args.extra,
        labels=dict(args.labels) if args.labels else None,
        idempotency_key=args.idempotency_key,
        output_format=args.output_format,
        quality=args.quality,
        webhook=args.webhook,
        webhook_events=args.webhook_events,
    )


def _request_dests() -> set[str]:
    """The argparse names of the request flags (to tell whether any was given)."""
    probe = argparse.ArgumentParser(add_help=False)
    add_request_arguments(probe)
    return set(vars(probe.parse_args(["--model", "-"])))


REQUEST_DESTS = _request_dests()
