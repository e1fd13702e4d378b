"""The Ray Serve peer of `bench.peers`: run by the interpreter of .venv-bench-ray, never by OmniRT's.

It starts a local Ray cluster, Ray Serve's HTTP proxy on `--host`/`--port`, and four
applications, one replica each:

    /noop        a no-op deployment: answers at once
    /noop-batch  the same behind `@serve.batch`
    /sd          the tiny-sd pipeline from `--model-dir` (plain diffusers `from_pretrained`)
    /sd-batch    the same behind `@serve.batch` (one pipeline call per group of a batch's
                 requests that share size, steps and guidance)

Requests are JSON `{"prompt": str, "seed": int, "width": int, "height": int, "steps": int,
"guidance": float}`; the no-op answers `{"ok": true}`, tiny-sd answers the PNG bytes. Like an
OmniRT worker with one slot, a replica runs one pipeline call at a time (a lock around a
thread) with `--torch-threads` torch threads. It prints `READY ray VERSION ...` once every
application answers, and shuts Ray down on SIGTERM or SIGINT. No OmniRT import: this is Ray's
side alone.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import signal
import sys
import threading
import time
from typing import Any

import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

# Requests one replica may hold at once: well above the benchmark's concurrency, so Ray's
# default cap (5) does not decide the result.
MAX_ONGOING = 256


def _load_pipeline(model_dir: str, threads: int) -> Any:
    import torch
    from diffusers import StableDiffusionPipeline

    torch.set_num_threads(threads)
    pipeline = StableDiffusionPipeline.from_pretrained(model_dir, dtype=torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _run_pipeline(pipeline: Any, bodies: list[dict[str, Any]]) -> list[bytes]:
    """One pipeline call for `bodies` (same size, steps and guidance); one PNG per body."""
    import torch

    first = bodies[0]
    images = pipeline(
        prompt=[b["prompt"] for b in bodies],
        width=first["width"],
        height=first["height"],
        num_inference_steps=first["steps"],
        guidance_scale=first["guidance"],
        generator=[torch.Generator("cpu").manual_seed(int(b["seed"])) for b in bodies],
    ).images
    encoded = []
    for image in images:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        encoded.append(buffer.getvalue())
    return encoded


def _run_groups(pipeline: Any, bodies: list[dict[str, Any]]) -> list[bytes]:
    """One pipeline call per group of `bodies` that share size, steps and guidance (Ray's
    `@serve.batch` has no grouping key: a batch takes whatever is queued), the PNGs in `bodies`'
    order. Every request of the batch is answered when the whole batch is done, as Ray does."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, b in enumerate(bodies):
        groups.setdefault((b["width"], b["height"], b["steps"], b["guidance"]), []).append(i)
    out: list[bytes] = [b""] * len(bodies)
    for indices in groups.values():
        for i, png in zip(indices, _run_pipeline(pipeline, [bodies[i] for i in indices]), strict=True):
            out[i] = png
    return out


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING)
class Noop:
    """Answers at once."""

    async def __call__(self, request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse({"ok": True})


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING)
class NoopBatch:
    """Answers at once, through `@serve.batch`."""

    def __init__(self, max_batch_size: int, batch_wait_s: float) -> None:
        self.answer.set_max_batch_size(max_batch_size)
        self.answer.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def answer(self, bodies: list[bytes]) -> list[dict[str, bool]]:
        return [{"ok": True} for _ in bodies]

    async def __call__(self, request: Request) -> JSONResponse:
        return JSONResponse(await self.answer(await request.body()))


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING)
class TinySD:
    """tiny-sd, one request per pipeline call, one call at a time."""

    def __init__(self, model_dir: str, threads: int) -> None:
        self.pipeline = _load_pipeline(model_dir, threads)
        self.lock = asyncio.Lock()

    async def __call__(self, request: Request) -> Response:
        body = await request.json()
        async with self.lock:
            (png,) = await asyncio.to_thread(_run_pipeline, self.pipeline, [body])
        return Response(png, media_type="image/png")


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=MAX_ONGOING)
class TinySDBatch:
    """tiny-sd behind `@serve.batch`: the requests queued together are one pipeline call."""

    def __init__(self, model_dir: str, threads: int, max_batch_size: int, batch_wait_s: float) -> None:
        self.pipeline = _load_pipeline(model_dir, threads)
        self.generate.set_max_batch_size(max_batch_size)
        self.generate.set_batch_wait_timeout_s(batch_wait_s)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.0)
    async def generate(self, bodies: list[dict[str, Any]]) -> list[bytes]:
        # One batch runs at a time (max_concurrent_batches=1), like one OmniRT slot.
        return await asyncio.to_thread(_run_groups, self.pipeline, bodies)

    async def __call__(self, request: Request) -> Response:
        return Response(await self.generate(await request.json()), media_type="image/png")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", required=True, help="the folder tiny-sd was saved into")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--batch-wait-s", type=float, default=0.0)
    parser.add_argument(
        "--noop-batch-wait-s", type=float, default=None, help="the no-op's batch wait (else --batch-wait-s)"
    )
    parser.add_argument("--num-cpus", type=int, default=0, help="Ray's logical CPUs (0 = all)")
    parser.add_argument("--temp-dir", default="", help="Ray's session folder (default Ray's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    init: dict[str, Any] = {"include_dashboard": False, "configure_logging": True, "log_to_driver": False}
    if args.num_cpus:
        init["num_cpus"] = args.num_cpus
    if args.temp_dir:
        init["_temp_dir"] = args.temp_dir
    started = time.perf_counter()
    ray.init(**init)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        batch = (args.max_batch_size, args.batch_wait_s)
        apps = {
            "noop": Noop.bind(),
            "noop-batch": NoopBatch.bind(
                args.max_batch_size,
                args.batch_wait_s if args.noop_batch_wait_s is None else args.noop_batch_wait_s,
            ),
            "sd": TinySD.bind(args.model_dir, args.torch_threads),
            "sd-batch": TinySDBatch.bind(args.model_dir, args.torch_threads, *batch),
        }
        for name, app in apps.items():
            serve.run(app, name=name, route_prefix=f"/{name}")
        print(f"READY ray {ray.__version__} in {time.perf_counter() - started:.1f} s", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
