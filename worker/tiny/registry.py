"""Tiny random-weight models OmniRT builds offline (`source: builtin:NAME`).

No machine here reaches a model hub, so the demo and the tests use real diffusers pipelines
with tiny, seeded random weights: every machine builds identical weights, saves them with
`save_pretrained` and loads them back with `from_pretrained` like any local model.

Builders are registered by name in `BUILDERS`; later issues add `tiny-wan` and friends.
A build goes into a temporary folder beside the target and is renamed into place, under a
file lock, so workers sharing a model dir never see (or make) a half-written model.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnirt.worker.tiny import wan as tiny_video_models

BUILTIN_PREFIX = "builtin:"
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


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP byte-level mapping: every byte to a printable unicode character."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


# A few frequent English pairs, so common words take fewer tokens than bytes.
_MERGE_PAIRS = ("th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "or", "es", "ca", "do", "og")


def write_clip_tokenizer_files(folder: Path) -> None:
    """Write a byte-level BPE `vocab.json` + `merges.txt` that CLIPTokenizer loads (~550 tokens)."""
    symbols = list(_bytes_to_unicode().values())
    vocab: dict[str, int] = {}
    for symbol in symbols:
        vocab[symbol] = len(vocab)
    for symbol in symbols:
        vocab[symbol + "</w>"] = len(vocab)
    merges = []
    for pair in _MERGE_PAIRS:
        for suffix in ("", "</w>"):
            merges.append(f"{pair[0]} {pair[1]}{suffix}")
            vocab[f"{pair}{suffix}"] = len(vocab)
    vocab["<|startoftext|>"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")


def build_tiny_sd(target: Path) -> None:
    """A tiny Stable Diffusion: 64x64 images (8x8 latents), CLIP text encoder of width 32."""
    import torch
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    with tempfile.TemporaryDirectory() as vocab_dir:
        write_clip_tokenizer_files(Path(vocab_dir))
        tokenizer = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)

    # Seeded on a forked RNG: identical weights everywhere, the caller's RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            block_out_channels=(32, 64),
            layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=32,
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=8,
            sample_size=64,
        )
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                max_position_embeddings=77,
                projection_dim=32,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        steps_offset=1,
    )
    pipeline: Any = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipeline.save_pretrained(str(target))


BUILDERS: dict[str, Builder] = {
    "tiny-sd": Builder(build_tiny_sd, version=1, description="tiny Stable Diffusion, 64x64, random weights"),
    "tiny-wan": Builder(
        tiny_video_models.build_tiny_wan, version=1, description="tiny Wan text-to-video, random weights"
    ),
    "tiny-wan-i2v": Builder(
        tiny_video_models.build_tiny_wan_i2v, version=1, description="tiny Wan image-to-video, random weights"
    ),
}


def builtin_names() -> list[str]:
    """Names usable as `builtin:NAME`."""
    return sorted(BUILDERS)


def builtin_name(source: str) -> str | None:
    """`NAME` for a `builtin:NAME` source, None for anything else."""
    return source[len(BUILTIN_PREFIX) :] if source.startswith(BUILTIN_PREFIX) else None


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
