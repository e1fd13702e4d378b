"""Export: encoding a result image as PNG, the worker's way versus Pillow's default.

Every image result is encoded before it leaves the worker, and on a GPU the encoding of a
512x512 PNG with Pillow's default settings costs a few percent of an SD-1.5-sized call. The
worker deflates PNG with run-length matching only (`omnirt.worker.export.image`) and encodes a
batch's images side by side on threads (`omnirt.worker.export.outputs`). This scenario times
both on photo-like images (smooth shapes plus sensor-like noise, as diffusion models make:
the tiny models' images are pure noise, which no PNG setting compresses) at the sizes of
SD 1.5 and SDXL, interleaved, in this process: no daemons.

    python -m bench.suite --only export
"""

from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass, replace
from typing import Any

from . import _scenario as sc

NAME = "export"
TITLE = "Export: PNG encoding of a result image, the worker's way vs Pillow's default"


@dataclass(frozen=True)
class Settings:
    """Sizes and counts of the export scenario; the defaults are the full run."""

    sizes: tuple[int, ...] = (512, 1024)  # square images, one encoding of each per round
    batch: int = 8  # images of the batch case (at the first size)
    rounds: int = 15  # timed rounds (after one untimed)

    @classmethod
    def quick(cls) -> Settings:
        return replace(cls(), sizes=(256,), batch=4, rounds=3)


def photo_like(size: int, seed: int = 0) -> Any:
    """A size x size RGB image of smooth random shapes plus sensor-like noise (sigma 4)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    cells = max(4, size // 24)
    shapes = Image.fromarray(rng.integers(0, 256, (cells, cells, 3), dtype=np.uint8))
    pixels = np.asarray(shapes.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32)
    noisy = np.clip(pixels + rng.normal(0, 4, pixels.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(noisy)


def _pillow(image: Any, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", **options)
    return buf.getvalue()


def _omnirt(image: Any, index: int = 0) -> bytes:
    from omnirt.worker.export import image as export

    data: bytes = export.image_artifact(image, index=index, seed=0, job_id="bench", fmt="png").data
    return data


def _timed(call: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = call()
    return time.perf_counter() - t0, out


def measure_size(size: int, rounds: int) -> dict[str, Any]:
    """Pillow's default, zlib level 1 and the worker's export of one image, interleaved."""
    image = photo_like(size)
    variants = {
        "pillow_default": functools.partial(_pillow, image),
        "pillow_level1": functools.partial(_pillow, image, compress_level=1),
        "omnirt": functools.partial(_omnirt, image),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    sizes: dict[str, int] = {}
    for round_ in range(rounds + 1):
        for name, call in variants.items():
            seconds, data = _timed(call)
            sizes[name] = len(data)
            if round_:  # the first round is untimed
                times[name].append(seconds)
    p50 = {name: sc.median(values) for name, values in times.items()}
    return {
        "size": f"{size}x{size}",
        **{f"{name}_p50_ms": sc.ms(p50[name]) for name in variants},
        **{f"{name}_bytes": sizes[name] for name in variants},
        "time_ratio": sc.ratio(p50["omnirt"], p50["pillow_default"]),
        "bytes_ratio": sc.ratio(sizes["omnirt"], sizes["pillow_default"]),
    }


def measure_batch(size: int, count: int, rounds: int) -> dict[str, Any]:
    """A batch's images encoded one after the other versus at once (the worker's way)."""
    from omnirt.worker.export import outputs as output_export

    images = [photo_like(size, seed) for seed in range(count)]
    calls = [functools.partial(_omnirt, image, i) for i, image in enumerate(images)]
    one_by_one: list[float] = []
    at_once: list[float] = []
    for round_ in range(rounds + 1):
        seconds, _ = _timed(lambda: [call() for call in calls])
        parallel, results = _timed(lambda: output_export.in_parallel(calls))
        assert not any(isinstance(r, Exception) for r in results), results
        if round_:
            one_by_one.append(seconds)
            at_once.append(parallel)
    seq, par = sc.median(one_by_one), sc.median(at_once)
    return {
        "size": f"{size}x{size}",
        "images": count,
        "one_by_one_p50_ms": sc.ms(seq),
        "at_once_p50_ms": sc.ms(par),
        "ratio": sc.ratio(par, seq),
    }


def run(settings: Settings, ctx: sc.Context) -> dict[str, Any]:
    cases = [measure_size(size, settings.rounds) for size in settings.sizes]
    batch = measure_batch(settings.sizes[0], settings.batch, settings.rounds)
    rows = [
        sc.Row(
            NAME,
            f"PNG of a {c['size']} photo-like image: encode p50",
            sc.fmt_ms(c["omnirt_p50_ms"]),
            f"Pillow default {sc.fmt_ms(c['pillow_default_p50_ms'])}",
            c["time_ratio"],
        ).as_dict()
        for c in cases
    ]
    rows.append(
        sc.Row(
            NAME,
            f"PNG of {batch['images']} images {batch['size']}: the batch's export p50",
            f"at once {sc.fmt_ms(batch['at_once_p50_ms'])}",
            f"one by one {sc.fmt_ms(batch['one_by_one_p50_ms'])}",
            batch["ratio"],
        ).as_dict()
    )
    return {"settings": sc.settings_dict(settings), "cases": cases, "batch": batch, "rows": rows}


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


def markdown(result: dict[str, Any]) -> str:
    settings = result["settings"]
    header = [
        "image",
        "Pillow default (level 6)",
        "zlib level 1",
        "OmniRT (Z_RLE, sha256 included)",
        "time OmniRT / default",
        "size OmniRT / default",
    ]
    rows = [
        [
            c["size"],
            f"{sc.fmt_ms(c['pillow_default_p50_ms'])}, {_kib(c['pillow_default_bytes'])}",
            f"{sc.fmt_ms(c['pillow_level1_p50_ms'])}, {_kib(c['pillow_level1_bytes'])}",
            f"{sc.fmt_ms(c['omnirt_p50_ms'])}, {_kib(c['omnirt_bytes'])}",
            f"**{c['time_ratio']}**",
            f"{c['bytes_ratio']:.3f}",
        ]
        for c in result["cases"]
    ]
    batch = result["batch"]
    return "\n\n".join(
        [
            "Encoding one photo-like image (smooth random shapes plus sensor-like noise: the tiny models' "
            "images are pure noise, which no PNG setting compresses) as PNG: Pillow's default settings, "
            "zlib level 1, and the worker's export (`omnirt.worker.export.image.image_artifact`: run-length "
            f"deflate, sha256). Medians of {settings['rounds']} interleaved rounds, in the benchmark "
            "process (no daemons).",
            sc.md_table(header, rows),
            f"A batch of {batch['images']} such images of {batch['size']}, encoded one after the other "
            f"versus at once on the worker's export threads (`omnirt.worker.export.outputs`, as a batched "
            f"call's results are): **{sc.fmt_ms(batch['one_by_one_p50_ms'])}** one by one, "
            f"**{sc.fmt_ms(batch['at_once_p50_ms'])}** at once (ratio {batch['ratio']}; it cannot go "
            "below 1 / the number of CPUs).",
            "Why it matters: the export is on every image request's path after the model's last step. "
            "On a GPU an SD-1.5-sized call at 512x512 takes about a second or less, and Pillow's default "
            "PNG settings alone would add several percent to it. After PNG's row filters a photo-like "
            "image has few long repeats, so the default's LZ77 search costs time and saves almost nothing; "
            "flat synthetic images (screenshots, gradients) do come out larger with run-length deflate "
            '(see docs/worker.md, "Artifacts").',
        ]
    )


SCENARIO = sc.Scenario(NAME, TITLE, Settings(), Settings.quick(), run, markdown, needs_models=False)
