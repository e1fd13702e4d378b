"""Models of different sources with byte-identical components share the loaded modules.

Real tiny models: `tiny-wan` copied to other folders whose transformer (or one VAE weight) is
changed, loaded through the real model cache.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import shutil
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from omnirt import types as t
from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache, pipeline_bytes
from omnirt.worker.pipelines.shared_components import folder_fingerprint
from omnirt.worker.runtime import backends
from omnirt.worker.tiny.registry import ensure_builtin

CPU = backends.Placement("cpu", "cpu", "float32")
WEIGHTS = "diffusion_pytorch_model.safetensors"


def reseed(path: Path, seed: int) -> None:
    """Replace every tensor of a safetensors file with other seeded random values (same shapes)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(path)
    save_file(
        {k: torch.randn(v.shape, generator=generator).to(v.dtype) * 0.02 for k, v in tensors.items()}, path
    )


def nudge_one_weight(path: Path) -> None:
    tensors = load_file(path)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1.0
    save_file(tensors, path)


@pytest.fixture(scope="module")
def wans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`a`: tiny-wan; `b`: its copy with another transformer; `vae`: its copy with one VAE weight changed."""
    root = tmp_path_factory.mktemp("shared")
    built = ensure_builtin("tiny-wan", root / "built")
    folders = {name: root / f"wan-{name}" for name in ("a", "b", "vae")}
    for folder in folders.values():
        shutil.copytree(built, folder)
    reseed(folders["b"] / "transformer" / WEIGHTS, seed=11)
    nudge_one_weight(folders["vae"] / "vae" / WEIGHTS)
    return folders


def wan(folder: Path) -> t.ModelSpec:
    return t.ModelSpec(id=folder.name, source=str(folder), pipeline_class="WanPipeline")


def video(cached: CachedPipeline) -> bytes:
    generator = torch.Generator().manual_seed(3)
    frames = cached.pipeline(
        prompt="a fox",
        width=32,
        height=32,
        num_frames=5,
        num_inference_steps=2,
        generator=generator,
        output_type="np",
    ).frames
    return bytes(frames.tobytes())


def alone(spec: t.ModelSpec, model_dir: Path, placement: backends.Placement = CPU) -> bytes:
    """The output of `spec` loaded by itself in a fresh cache."""
    return video(ModelCache(model_dir).get(spec, placement))


def module_bytes(*modules: Any) -> int:
    return pipeline_bytes(type("P", (), {"components": dict(enumerate(modules))})())


def test_identical_components_are_loaded_once_and_outputs_do_not_change(
    wans: dict[str, Path], model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ModelCache(model_dir)
    a = cache.get(wan(wans["a"]), CPU)
    with caplog.at_level(logging.INFO, logger="omnirt.worker.pipelines.model_cache"):
        b = cache.get(wan(wans["b"]), CPU)
    assert b.pipeline.text_encoder is a.pipeline.text_encoder
    assert b.pipeline.vae is a.pipeline.vae
    assert b.pipeline.transformer is not a.pipeline.transformer
    assert b.shared == ("text_encoder", "vae")
    assert "shared text_encoder, vae with wan-a" in caplog.text
    # Same seed, same bytes as each model loaded alone; the two models do differ.
    assert video(a) == alone(wan(wans["a"]), model_dir)
    assert video(b) == alone(wan(wans["b"]), model_dir)
    assert video(a) != video(b)


def test_the_budget_counts_shared_bytes_once_and_eviction_keeps_the_other_model(
    wans: dict[str, Path], model_dir: Path
) -> None:
    probe = ModelCache(model_dir)
    a0, b0 = probe.get(wan(wans["a"]), CPU), probe.get(wan(wans["b"]), CPU)
    full = pipeline_bytes(a0.pipeline)  # each wan alone (same shapes, other values)
    shared = module_bytes(a0.pipeline.text_encoder, a0.pipeline.vae)
    transformer = module_bytes(a0.pipeline.transformer)
    # The rule: held bytes are the distinct tensors of all held models, shared modules once.
    assert probe.held_bytes() == 2 * full - shared
    del probe, a0, b0

    # Room for both wans only because their text encoder and VAE count once.
    budget = 2 * full - shared + transformer // 2
    cache = ModelCache(model_dir, budget_bytes=budget)
    a = cache.get(wan(wans["a"]), CPU)
    cache.release(a)
    b = cache.get(wan(wans["b"]), CPU)  # not released: in use
    assert b.evicted == () and not b.warnings and b.shared == ("text_encoder", "vae")
    assert cache.held_bytes() == 2 * full - shared <= budget
    expected_b = alone(wan(wans["b"]), model_dir)

    first = weakref.ref(a.pipeline)
    del a
    # A third model (its own VAE and transformer) evicts the idle wan-a; wan-b is in use.
    third = cache.get(wan(wans["vae"]), CPU)
    assert third.evicted == ("wan-a",) and third.shared == ("text_encoder",)
    gc.collect()
    assert first() is None
    # wan-a's text encoder and VAE stayed for wan-b, and still count, once.
    text_encoder = module_bytes(b.pipeline.text_encoder)
    assert cache.held_bytes() == 2 * full - text_encoder
    assert video(b) == expected_b


def test_a_component_that_differs_by_one_weight_is_not_shared(wans: dict[str, Path], model_dir: Path) -> None:
    cache = ModelCache(model_dir)
    a = cache.get(wan(wans["a"]), CPU)
    other = cache.get(wan(wans["vae"]), CPU)
    assert other.pipeline.vae is not a.pipeline.vae
    assert other.pipeline.text_encoder is a.pipeline.text_encoder
    assert other.shared == ("text_encoder",)
    assert video(other) == alone(wan(wans["vae"]), model_dir)


def test_another_dtype_or_cpu_offload_is_not_shared(wans: dict[str, Path], model_dir: Path) -> None:
    cache = ModelCache(model_dir)
    a = cache.get(wan(wans["a"]), CPU)
    bf16 = backends.Placement("cpu", "cpu", "bfloat16")
    other = cache.get(wan(wans["b"]), bf16)
    assert other.shared == ()
    assert other.pipeline.text_encoder is not a.pipeline.text_encoder
    assert other.pipeline.text_encoder.dtype == torch.bfloat16
    assert a.pipeline.text_encoder.dtype == torch.float32


def test_lora_loadable_components_are_not_shared(model_dir: Path, tmp_path: Path) -> None:
    """SD's text encoder takes LoRA layers in place (peft), so only its VAE is shared."""
    base = ensure_builtin("tiny-sd", model_dir)
    copy = tmp_path / "sd-b"
    shutil.copytree(base, copy)
    reseed(copy / "unet" / WEIGHTS, seed=5)
    cache = ModelCache(model_dir)
    a = cache.get(t.ModelSpec(id="sd-a", source=str(base), pipeline_class="StableDiffusionPipeline"), CPU)
    b = cache.get(t.ModelSpec(id="sd-b", source=str(copy), pipeline_class="StableDiffusionPipeline"), CPU)
    assert b.shared == ("vae",)
    assert b.pipeline.vae is a.pipeline.vae
    assert b.pipeline.text_encoder is not a.pipeline.text_encoder
    assert b.pipeline.unet is not a.pipeline.unet


def test_a_hub_cache_snapshot_is_fingerprinted_by_its_blob_names(tmp_path: Path) -> None:
    blobs = tmp_path / "models--x--y" / "blobs"
    blobs.mkdir(parents=True)
    contents = {"config.json": b'{"a": 1}', WEIGHTS: b"weights"}

    def snapshot(name: str, files: dict[str, bytes]) -> Path:
        folder = tmp_path / "models--x--y" / "snapshots" / name / "vae"
        folder.mkdir(parents=True)
        for file, data in files.items():
            blob = blobs / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            os.symlink(os.path.relpath(blob, folder), folder / file)
        return folder

    one = snapshot("1" * 40, contents)
    two = snapshot("2" * 40, contents)
    three = snapshot("3" * 40, {**contents, WEIGHTS: b"other weights"})
    assert folder_fingerprint(one) == folder_fingerprint(two) != folder_fingerprint(three)
    # A plain folder hashes the same contents to the same sha256 a snapshot has for a name.
    plain = tmp_path / "plain"
    plain.mkdir()
    for file, data in contents.items():
        (plain / file).write_bytes(data)
    assert folder_fingerprint(plain) == folder_fingerprint(one)


def test_the_builtin_wan_text_to_video_and_image_to_video_share_their_encoder_and_vae(
    model_dir: Path,
) -> None:
    """As Wan 2.1 T2V and I2V do, the two builtins ship the same text encoder and VAE."""
    cache = ModelCache(model_dir)
    t2v = cache.get(t.ModelSpec(id="tiny-wan", source="builtin:tiny-wan", pipeline_class="WanPipeline"), CPU)
    i2v = cache.get(
        t.ModelSpec(
            id="tiny-wan-i2v", source="builtin:tiny-wan-i2v", pipeline_class="WanImageToVideoPipeline"
        ),
        CPU,
    )
    assert i2v.shared == ("text_encoder", "vae")
    assert i2v.pipeline.text_encoder is t2v.pipeline.text_encoder
    assert i2v.pipeline.transformer is not t2v.pipeline.transformer
