"""The offline tiny Stable Diffusion: built, saved, reloaded and run like a real model."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import StableDiffusionPipeline
from PIL import Image

from omnirt.worker.export import image as export
from omnirt.worker.tiny import registry as tiny_models
from omnirt.worker.tiny import tokenizers


@pytest.fixture(scope="module")
def pipeline(model_dir: Path) -> StableDiffusionPipeline:
    pipe = StableDiffusionPipeline.from_pretrained(str(model_dir / "tiny-sd"), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _png(pipe: Any, seed: int, prompt: str = "a red fox") -> bytes:
    image = pipe(
        prompt,
        num_inference_steps=4,
        guidance_scale=5.0,
        generator=[torch.Generator("cpu").manual_seed(seed)],
    ).images[0]
    return export.encode_image(image, "png")


def test_build_writes_a_loadable_diffusers_folder(model_dir: Path) -> None:
    folder = model_dir / "tiny-sd"
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionPipeline"
    for part in ("unet", "vae", "text_encoder", "tokenizer", "scheduler"):
        assert (folder / part).is_dir(), part
    marker = json.loads((folder / tiny_models.MARKER).read_text())
    assert marker == {"name": "tiny-sd", "version": tiny_models.BUILDERS["tiny-sd"].version}
    # No staging or stale folders are left behind.
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".tiny-sd.") and p.is_dir()]


def test_default_output_is_a_64x64_image_that_is_not_flat(pipeline: StableDiffusionPipeline) -> None:
    image = Image.open(io.BytesIO(_png(pipeline, 1)))
    assert image.size == (64, 64)
    assert np.asarray(image).astype(float).std() > 1.0


def test_same_seed_same_bytes_other_seed_other_bytes(pipeline: StableDiffusionPipeline) -> None:
    first, again, other = _png(pipeline, 3), _png(pipeline, 3), _png(pipeline, 4)
    assert hashlib.sha256(first).digest() == hashlib.sha256(again).digest()
    assert first != other


def test_weights_are_identical_on_every_build(tmp_path: Path, model_dir: Path) -> None:
    rebuilt = tiny_models.ensure_builtin("tiny-sd", tmp_path)
    for weights in sorted((model_dir / "tiny-sd").rglob("*.safetensors")):
        twin = rebuilt / weights.relative_to(model_dir / "tiny-sd")
        assert twin.read_bytes() == weights.read_bytes(), weights.name


def test_ensure_builtin_reuses_a_built_model(model_dir: Path) -> None:
    folder = model_dir / "tiny-sd"
    before = (folder / "model_index.json").stat().st_mtime_ns
    assert tiny_models.ensure_builtin("tiny-sd", model_dir) == folder
    assert (folder / "model_index.json").stat().st_mtime_ns == before


def test_an_outdated_build_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_build(target: Path) -> None:
        calls.append(target)
        (target / "model_index.json").write_text("{}")

    monkeypatch.setitem(tiny_models.BUILDERS, "tiny-test", tiny_models.Builder(fake_build, 1, "test"))
    folder = tiny_models.ensure_builtin("tiny-test", tmp_path)
    monkeypatch.setitem(tiny_models.BUILDERS, "tiny-test", tiny_models.Builder(fake_build, 2, "test"))
    assert tiny_models.ensure_builtin("tiny-test", tmp_path) == folder
    assert len(calls) == 2
    assert json.loads((folder / tiny_models.MARKER).read_text())["version"] == 2


def test_unknown_builtin_names_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(tiny_models.BuiltinModelError, match="tiny-sd"):
        tiny_models.ensure_builtin("tiny-nothing", tmp_path)


def test_tokenizer_files_are_byte_level_bpe(tmp_path: Path) -> None:
    from transformers import CLIPTokenizer

    tokenizers.write_clip_tokenizer_files(tmp_path)
    tokenizer = CLIPTokenizer.from_pretrained(str(tmp_path))
    assert 300 <= len(tokenizer) <= 1000
    ids = tokenizer("the cat, naïve 猫").input_ids
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert tokenizer.unk_token_id not in ids[1:-1]  # every byte has a token
