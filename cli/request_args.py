"""The request flags shared by `generate` and `validate`, and the request they build."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from omnirt._internal.requests import build_request
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


def add_request_arguments(parser: argparse.ArgumentParser, *, model_required: bool = True) -> None:
    """Flags for every field of a `GenerateRequest` people set by hand."""
    g = parser.add_argument_group("request")
    g.add_argument("--model", "-m", required=model_required, help="model id or alias from the catalog")
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
