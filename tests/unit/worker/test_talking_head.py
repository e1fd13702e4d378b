"""The tiny streaming talking head: built by the registry, loaded, then a session fed chunks of
speech-like PCM, each answered by its 28 frames, conditioned on the audio, the portrait, the seed
and the previous chunk's motion."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from omnirt.worker.pipelines.talking_head import (
    Chunk,
    InvalidAudioError,
    InvalidReferenceError,
    SessionClosedError,
    TalkingHeadInputError,
    TalkingHeadPipeline,
)
from omnirt.worker.tiny import registry

NAME = "tiny-talking-head"
CHUNK_SAMPLES, RATE, FRAMES, CHUNK_MS = 17920, 16000, 28, 1120
SEED = 7


def speech(seed: int) -> np.ndarray:
    """1.12 s of a voiced, syllable-paced signal: a wandering pitch's harmonics under a ~4 Hz
    envelope, with breath noise, as int16."""
    rng = np.random.default_rng(seed)
    t = np.arange(CHUNK_SAMPLES) / RATE
    pitch = rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 2) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * t + rng.uniform(0, np.pi)), 0, None)
    signal = 0.3 * voiced * envelope + 0.01 * rng.standard_normal(CHUNK_SAMPLES)
    return np.round(np.clip(signal, -1, 1) * 32767).astype(np.int16)


def portrait(seed: int) -> Image.Image:
    """A 96x80 face-ish image: a skin ellipse with dark eyes and mouth on a random backdrop."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:96, 0:80]
    image = np.zeros((96, 80, 3)) + rng.uniform(0, 255, 3)
    image[((x - 40) / 28) ** 2 + ((y - 48) / 38) ** 2 < 1] = rng.uniform(150, 240, 3)
    for cx, cy, rx, ry in ((28, 38, 5, 3), (52, 38, 5, 3), (40, 68, 12, 4)):
        image[((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 < 1] = 30
    return Image.fromarray(image.astype(np.uint8))


def frames_of(
    pipeline: TalkingHeadPipeline, image: Image.Image, seed: int, chunks: list[Any]
) -> list[np.ndarray]:
    session = pipeline.open(image, seed)
    try:
        return [session.push(pcm).frames for pcm in chunks]
    finally:
        session.close()


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as a worker pinned with `torch_threads=1` runs: the printed chunk time is
    one core's, and the tests do not crowd a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def folder(model_dir: Path) -> Path:
    return registry.ensure_builtin(NAME, model_dir)


@pytest.fixture(scope="module")
def pipeline(folder: Path) -> TalkingHeadPipeline:
    return TalkingHeadPipeline.from_pretrained(folder, "cpu")


@pytest.fixture(scope="module")
def stream(pipeline: TalkingHeadPipeline) -> list[tuple[np.ndarray, Chunk]]:
    """Three chunks pushed into one session, with the CPU time of each (printed, not asserted)."""
    session = pipeline.open(portrait(0), SEED)
    pushed = []
    for index in range(3):
        pcm = speech(index)
        started_cpu, started = time.process_time(), time.perf_counter()
        chunk = session.push(pcm)
        print(
            f"tiny-talking-head chunk {index}: {time.process_time() - started_cpu:.3f} s CPU, "
            f"{time.perf_counter() - started:.3f} s wall for {CHUNK_MS} ms of audio"
        )
        pushed.append((pcm, chunk))
    session.close()
    return pushed


def test_build_writes_every_part_and_the_streaming_geometry(folder: Path) -> None:
    for part in (
        "audio_encoder/config.json",
        "audio_encoder/preprocessor_config.json",
        "denoiser/config.json",
    ):
        assert (folder / part).is_file(), part
    assert (folder / "vae" / "diffusion_pytorch_model.safetensors").is_file()
    assert (folder / "scheduler" / "scheduler_config.json").is_file()
    geometry = json.loads((folder / "talking_head.json").read_text())
    assert geometry["fps"] == 25 and geometry["sample_rate"] == RATE
    assert geometry["chunk_samples"] == CHUNK_SAMPLES and geometry["frames_per_chunk"] == FRAMES
    assert json.loads((folder / "audio_encoder" / "config.json").read_text())["hidden_size"] == 32


def test_each_chunk_is_28_frames_with_its_audio_and_pts(stream: list[tuple[np.ndarray, Chunk]]) -> None:
    for index, (pcm, chunk) in enumerate(stream):
        assert chunk.index == index
        assert chunk.pts_ms == index * CHUNK_MS
        assert chunk.frames.shape == (FRAMES, 64, 64, 3) and chunk.frames.dtype == np.uint8
        assert chunk.audio.dtype == np.int16 and np.array_equal(chunk.audio, pcm)
        assert chunk.frames.astype(float).std() > 1.0  # not a flat image
        assert not np.array_equal(chunk.frames[0], chunk.frames[-1])  # the frames move


def test_same_seed_and_inputs_give_the_same_frames(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    again = frames_of(pipeline, portrait(0), SEED, [pcm for pcm, _ in stream])
    for (_, chunk), frames in zip(stream, again, strict=True):
        assert np.array_equal(frames, chunk.frames)


def test_other_audio_gives_other_frames(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    (other,) = frames_of(pipeline, portrait(0), SEED, [speech(10)])
    assert not np.array_equal(other, stream[0][1].frames)


def test_another_portrait_gives_other_frames(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    (other,) = frames_of(pipeline, portrait(1), SEED, [stream[0][0]])
    assert not np.array_equal(other, stream[0][1].frames)


def test_another_seed_gives_other_frames(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    (other,) = frames_of(pipeline, portrait(0), SEED + 1, [stream[0][0]])
    assert not np.array_equal(other, stream[0][1].frames)


def test_a_chunk_carries_the_motion_of_the_one_before(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    # Same seed (so the same noise), same second chunk of audio, another first chunk.
    _, second = frames_of(pipeline, portrait(0), SEED, [speech(11), stream[1][0]])
    assert not np.array_equal(second, stream[1][1].frames)


def test_float32_pcm_is_read_like_its_int16_twin(
    pipeline: TalkingHeadPipeline, stream: list[tuple[np.ndarray, Chunk]]
) -> None:
    (frames,) = frames_of(pipeline, portrait(0), SEED, [stream[0][0].astype(np.float32) / 32768])
    assert np.array_equal(frames, stream[0][1].frames)


@pytest.mark.parametrize(
    ("pcm", "says"),
    [
        (np.zeros(CHUNK_SAMPLES - 1, np.int16), "exactly 17920 samples"),
        (np.zeros(CHUNK_SAMPLES + 320, np.int16), "got 18240"),
        (np.zeros((CHUNK_SAMPLES, 2), np.int16), "1-D"),
        (np.zeros(CHUNK_SAMPLES, np.float64), "int16 or float32"),
        (np.zeros(CHUNK_SAMPLES, np.int32), "int16 or float32"),
        ([0] * CHUNK_SAMPLES, "numpy array"),
        (np.full(CHUNK_SAMPLES, 1.5, np.float32), "within [-1, 1]"),
        (np.full(CHUNK_SAMPLES, np.nan, np.float32), "finite"),
    ],
    ids=["short", "long", "stereo", "float64", "int32", "list", "loud-float", "nan"],
)
def test_bad_audio_is_refused_naming_pcm(pipeline: TalkingHeadPipeline, pcm: Any, says: str) -> None:
    session = pipeline.open(portrait(0), SEED)
    with pytest.raises(InvalidAudioError, match=r"^pcm: ") as caught:
        session.push(pcm)
    assert isinstance(caught.value, ValueError) and caught.value.field == "pcm"
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("reference", "seed", "field"),
    [
        (np.zeros((64, 64, 3), np.uint8), SEED, "reference_image"),
        ("face.png", SEED, "reference_image"),
        (Image.new("RGB", (0, 0)), SEED, "reference_image"),
        (None, SEED, "reference_image"),
        (portrait(0), -1, "seed"),
        (portrait(0), "7", "seed"),
    ],
    ids=["array", "path", "empty", "none", "negative-seed", "string-seed"],
)
def test_bad_reference_or_seed_is_refused_naming_it(
    pipeline: TalkingHeadPipeline, reference: Any, seed: Any, field: str
) -> None:
    with pytest.raises(InvalidReferenceError, match=rf"^{field}: ") as caught:
        pipeline.open(reference, seed)
    assert isinstance(caught.value, ValueError) and caught.value.field == field


def test_a_push_after_close_is_refused(pipeline: TalkingHeadPipeline) -> None:
    session = pipeline.open(portrait(0), SEED)
    session.close()
    session.close()  # idempotent
    with pytest.raises(SessionClosedError, match=r"^session: is closed") as caught:
        session.push(speech(0))
    assert isinstance(caught.value, TalkingHeadInputError) and caught.value.field == "session"


def test_the_build_makes_the_same_bytes_every_time(tmp_path: Path, folder: Path) -> None:
    rebuilt = registry.ensure_builtin(NAME, tmp_path)
    files = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file())
    assert any(p.suffix == ".safetensors" for p in files)
    for name in files:
        assert (rebuilt / name).read_bytes() == (folder / name).read_bytes(), name


def test_a_bfloat16_load_streams_the_same_geometry(folder: Path) -> None:
    pipeline = TalkingHeadPipeline.from_pretrained(folder, "cpu", torch.bfloat16)
    assert pipeline.denoiser.dtype == torch.bfloat16
    (frames,) = frames_of(pipeline, portrait(0), SEED, [speech(0)])
    assert frames.shape == (FRAMES, 64, 64, 3) and frames.dtype == np.uint8
    assert frames.astype(float).std() > 1.0
