"""Tiny random-weight models OmniRT builds offline (`source: builtin:NAME`).

No machine here reaches a model hub, so the demo and the tests use real diffusers pipelines
with tiny, seeded random weights: every machine builds identical weights, saves them with
`save_pretrained` and loads them back with `from_pretrained` like any local model.

Builders are registered by name in `BUILDERS`, one module per family (`sd`, `sdxl`, `sd3`, `flux`,
`flux2`, `hidream`, `pixart`, `sana`, `lumina2`, `qwen_image`, `qwen_image_edit`, `kolors`, `wan`, `wan22`,
`skyreels_v2`, `cogvideox`, `ltx`, `mochi`, `hunyuan_video`, `hunyuan_video15`, `kandinsky5`, `svd`,
`stable_audio`, `audioldm2`; transformers' `vits`);
`tokenizers` makes their offline tokenizers.
A build goes into a temporary folder beside the target and is renamed into place, under a
file lock, so workers sharing a model dir never see (or make) a half-written model.

This module is the one place that reads a `builtin:` source: `builtin_name` parses it,
`source_location` and `resolve_source` say where any source's files are (a builtin model under
the model dir, a local folder, or a hub id as given). `builtin:null` is built by nobody: it
names the null family's model, which has no weights (`omnirt.worker.modes.null`).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omnirt.worker.tiny import (
    audioldm2,
    cogvideox,
    flux,
    flux2,
    hidream,
    hunyuan_video,
    hunyuan_video15,
    kandinsky5,
    kolors,
    ltx,
    lumina2,
    mochi,
    pixart,
    qwen_image,
    qwen_image_edit,
    sana,
    sd,
    sd3,
    sdxl,
    skyreels_v2,
    stable_audio,
    svd,
    talking_head,
    vits,
    wan,
    wan22,
)

BUILTIN_PREFIX = "builtin:"
NULL_MODEL = "null"  # `builtin:null`: the null family's model, nothing to build
# Written last into a built model; records which builder version made it.
MARKER = "omnirt_builtin.json"


class BuiltinModelError(Exception):
    """No builtin model has that name, or building it failed."""


@dataclass(frozen=True)
class Builder:
    """Builds one tiny model into an empty folder; bump `version` when the output changes."""

    build: Callable[[Path], None]
    version: int
    description: str


BUILDERS: dict[str, Builder] = {
    "tiny-sd": Builder(
        sd.build_tiny_sd, version=1, description="tiny Stable Diffusion, 64x64, random weights"
    ),
    "tiny-wan": Builder(wan.build_tiny_wan, version=1, description="tiny Wan text-to-video, random weights"),
    "tiny-wan-i2v": Builder(
        wan.build_tiny_wan_i2v, version=1, description="tiny Wan image-to-video, random weights"
    ),
    "tiny-wan22": Builder(
        wan22.build_tiny_wan22, version=1, description="tiny Wan 2.2 two-expert text-to-video, random weights"
    ),
    "tiny-wan22-i2v": Builder(
        wan22.build_tiny_wan22_i2v,
        version=1,
        description="tiny Wan 2.2 two-expert image-to-video, random weights",
    ),
    "tiny-wan22-ti2v": Builder(
        wan22.build_tiny_wan22_ti2v,
        version=1,
        description="tiny Wan 2.2 TI2V-5B-style text/image-to-video, random weights",
    ),
    "tiny-skyreels-v2": Builder(
        skyreels_v2.build_tiny_skyreels_v2,
        version=1,
        description="tiny SkyReels-V2 text-to-video, random weights",
    ),
    "tiny-skyreels-v2-i2v": Builder(
        skyreels_v2.build_tiny_skyreels_v2_i2v,
        version=1,
        description="tiny SkyReels-V2 image-to-video, random weights",
    ),
    "tiny-skyreels-v2-df": Builder(
        skyreels_v2.build_tiny_skyreels_v2_df,
        version=1,
        description="tiny SkyReels-V2 diffusion-forcing text-to-video, random weights",
    ),
    "tiny-svd": Builder(
        svd.build_tiny_svd,
        version=1,
        description="tiny Stable Video Diffusion image-to-video, random weights",
    ),
    "tiny-cogvideox": Builder(
        cogvideox.build_tiny_cogvideox, version=1, description="tiny CogVideoX text-to-video, random weights"
    ),
    "tiny-hunyuan-video": Builder(
        hunyuan_video.build_tiny_hunyuan_video,
        version=1,
        description="tiny HunyuanVideo text-to-video, random weights",
    ),
    "tiny-hunyuan-video15": Builder(
        hunyuan_video15.build_tiny_hunyuan_video15,
        version=1,
        description="tiny HunyuanVideo 1.5 text-to-video, random weights",
    ),
    "tiny-hunyuan-video15-i2v": Builder(
        hunyuan_video15.build_tiny_hunyuan_video15_i2v,
        version=1,
        description="tiny HunyuanVideo 1.5 image-to-video, random weights",
    ),
    "tiny-kandinsky5": Builder(
        kandinsky5.build_tiny_kandinsky5,
        version=1,
        description="tiny Kandinsky 5 text-to-video, random weights",
    ),
    "tiny-kandinsky5-t2i": Builder(
        kandinsky5.build_tiny_kandinsky5_t2i,
        version=1,
        description="tiny Kandinsky 5 text-to-image, 1024x1024 area, random weights",
    ),
    "tiny-kandinsky5-i2v": Builder(
        kandinsky5.build_tiny_kandinsky5_i2v,
        version=1,
        description="tiny Kandinsky 5 image-to-video (the text-to-video weights), random weights",
    ),
    "tiny-kandinsky5-i2i": Builder(
        kandinsky5.build_tiny_kandinsky5_i2i,
        version=1,
        description="tiny Kandinsky 5 image-to-image, 1024x1024 area, random weights",
    ),
    "tiny-ltx-video": Builder(
        ltx.build_tiny_ltx_video, version=1, description="tiny LTX-Video text-to-video, random weights"
    ),
    "tiny-mochi": Builder(
        mochi.build_tiny_mochi, version=1, description="tiny Mochi text-to-video, random weights"
    ),
    "tiny-sdxl": Builder(
        sdxl.build_tiny_sdxl, version=1, description="tiny Stable Diffusion XL, 64x64, random weights"
    ),
    "tiny-pixart-sigma": Builder(
        pixart.build_tiny_pixart_sigma, version=1, description="tiny PixArt-Sigma, random weights"
    ),
    "tiny-sd3": Builder(
        sd3.build_tiny_sd3, version=2, description="tiny Stable Diffusion 3, 64x64, random weights"
    ),
    "tiny-flux": Builder(flux.build_tiny_flux, version=1, description="tiny Flux.1, 64x64, random weights"),
    "tiny-flux2": Builder(
        flux2.build_tiny_flux2, version=1, description="tiny FLUX.2 text/image-to-image, random weights"
    ),
    "tiny-hidream": Builder(
        hidream.build_tiny_hidream, version=1, description="tiny HiDream-I1, 1024x1024 area, random weights"
    ),
    "tiny-sana": Builder(
        sana.build_tiny_sana, version=1, description="tiny Sana text-to-image, random weights"
    ),
    "tiny-qwen-image": Builder(
        qwen_image.build_tiny_qwen_image,
        version=1,
        description="tiny Qwen-Image text/image-to-image, 64x64, random weights",
    ),
    "tiny-qwen-image-edit": Builder(
        qwen_image_edit.build_tiny_qwen_image_edit,
        version=1,
        description="tiny Qwen-Image-Edit image editing, 64x64, random weights",
    ),
    "tiny-kolors": Builder(
        kolors.build_tiny_kolors,
        version=1,
        description="tiny Kolors text/image-to-image, 64x64, random weights",
    ),
    "tiny-lumina2": Builder(
        lumina2.build_tiny_lumina2,
        version=1,
        description="tiny Lumina-Image 2.0 text-to-image, random weights",
    ),
    "tiny-stable-audio": Builder(
        stable_audio.build_tiny_stable_audio,
        version=1,
        description="tiny Stable Audio text-to-audio, stereo 8 kHz, random weights",
    ),
    "tiny-vits": Builder(
        vits.build_tiny_vits,
        version=1,
        description="tiny VITS (MMS-TTS) text-to-speech, transformers layout, mono 16 kHz, random weights",
    ),
    "tiny-audioldm2": Builder(
        audioldm2.build_tiny_audioldm2,
        version=1,
        description="tiny AudioLDM 2 text-to-audio, mono 16 kHz, random weights",
    ),
    "tiny-talking-head": Builder(
        talking_head.build_tiny_talking_head,
        version=1,
        description="tiny streaming talking head, 28 frames of 64x64 per 1.12 s chunk, random weights",
    ),
}


def builtin_names() -> list[str]:
    """Names usable as `builtin:NAME`."""
    return sorted(BUILDERS)


def builtin_name(source: str) -> str | None:
    """`NAME` for a `builtin:NAME` source, None for anything else."""
    return source[len(BUILTIN_PREFIX) :] if source.startswith(BUILTIN_PREFIX) else None


def source_location(source: str, model_dir: str | Path) -> str:
    """Where `source`'s files are, without building anything: MODEL_DIR/NAME for `builtin:NAME`
    (there or not yet), a local folder with `~` expanded, else `source` as given (a hub id)."""
    name = builtin_name(source)
    if name is not None:
        return str(Path(model_dir) / name)
    expanded = os.path.expanduser(source)
    return expanded if os.path.exists(expanded) else source


def resolve_source(source: str, model_dir: str | Path) -> str:
    """`source_location`, with a builtin model built first when missing or outdated
    (BuiltinModelError when there is no such builtin model or its build fails)."""
    name = builtin_name(source)
    if name is not None:
        return str(ensure_builtin(name, model_dir))
    return source_location(source, model_dir)


def _built_version(path: Path) -> int | None:
    try:
        return int(json.loads((path / MARKER).read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_builtin(name: str, model_dir: str | Path) -> Path:
    """The folder of builtin model `name` under `model_dir`, built first if missing or outdated."""
    if name not in BUILDERS:
        raise BuiltinModelError(f"no builtin model named {name!r}; known: {', '.join(builtin_names())}")
    builder = BUILDERS[name]
    root = Path(model_dir)
    target = root / name
    if _built_version(target) == builder.version:
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{name}.lock"):
        # Another process may have built it while we waited for the lock.
        if _built_version(target) == builder.version:
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.building-", dir=root))
        try:
            builder.build(staging)
            (staging / MARKER).write_text(json.dumps({"name": name, "version": builder.version}))
            if target.exists():
                # An older version (or a broken folder): move it aside, then swap the new one in.
                stale = Path(tempfile.mkdtemp(prefix=f".{name}.stale-", dir=root))
                target.rename(stale / name)
                shutil.rmtree(stale, ignore_errors=True)
            staging.rename(target)
        except Exception as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise BuiltinModelError(f"building builtin model {name!r} failed: {exc}") from exc
    return target
