"""persistent_worker's streaming sessions: the tiny talking head on a real 2-rank torchrun group.

One group (gloo, CPU, one torch thread per rank) is shared by the tests of this module in file
order (a start costs seconds); the killed-rank test restarts it. Every chunk is compared with
what `TalkingHeadPipeline` makes in this process for the same portrait, seed and audio.

Tolerance: frames equal the single-process pipeline's within MAX_DIFF (1/255) per value. Both
ranks denoise the same clip (the same latents, bit for bit: the same weights, inputs, seed and
one thread); the split decodes 14 frames per rank where the pipeline decodes 28 in one batch,
and the VAE's conv kernels sum in a batch-size-dependent order: about 5e-6 in [-1, 1] measured
here, which flips the uint8 rounding of a handful of the 344,064 values of a chunk by one level
(measured: at most 1/255, a few values per chunk). Audio and pts are exact. A wrong share, a
swapped half or a misaligned seed moves values by tens.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from worker_testing import make_assignment

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.persistent.executor import PersistentWorkerExecutor
from omnirt.worker.modes.persistent.launch import pid_alive
from omnirt.worker.modes.persistent.session import GroupSession
from omnirt.worker.pipelines.talking_head import TalkingHeadPipeline
from omnirt.worker.realtime.api import OpenRequest, SessionRefused
from omnirt.worker.tiny import registry

MAX_DIFF = 1
SAMPLES, RATE, FRAMES, CHUNK_MS = 17920, 16000, 28, 1120
MODEL = t.ModelSpec(
    id="tiny-talking-head-pw",
    source="builtin:tiny-talking-head",
    pipeline_class="TalkingHeadPipeline",
    execution_mode="persistent_worker",
    runtime={"nproc_per_node": 2.0, "restart_backoff_s": 0.2},
    streaming=True,
)


def speech(seed: int) -> np.ndarray:
    """1.12 s of a voiced, syllable-paced signal as int16 (a pitch's harmonics under a ~4 Hz envelope)."""
    rng = np.random.default_rng(seed)
    times = np.arange(SAMPLES) / RATE
    phase = 2 * np.pi * np.cumsum(rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * times))) / RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 6))
    envelope = np.clip(np.sin(2 * np.pi * rng.uniform(3, 5) * times), 0, None)
    signal_ = 0.3 * voiced * envelope + 0.01 * rng.standard_normal(SAMPLES)
    return np.round(np.clip(signal_, -1, 1) * 32767).astype(np.int16)


def portrait(seed: int) -> Image.Image:
    """A 96x80 face-ish image: a skin ellipse with dark eyes and mouth on a random backdrop."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:96, 0:80]
    image = np.zeros((96, 80, 3)) + rng.uniform(0, 255, 3)
    image[((x - 40) / 28) ** 2 + ((y - 48) / 38) ** 2 < 1] = rng.uniform(150, 240, 3)
    for cx, cy, rx, ry in ((28, 38, 5, 3), (52, 38, 5, 3), (40, 68, 12, 4)):
        image[((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 < 1] = 30
    return Image.fromarray(image.astype(np.uint8))


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread here, as on the ranks (`torch_threads=1`): the same kernels, the same sums."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipe(model_dir: Path) -> TalkingHeadPipeline:
    return TalkingHeadPipeline.from_pretrained(registry.ensure_builtin("tiny-talking-head", model_dir), "cpu")


@pytest.fixture(scope="module")
def pw(model_dir: Path) -> Iterator[PersistentWorkerExecutor]:
    executor = PersistentWorkerExecutor(
        WorkerConfig(mode="persistent_worker", model_dir=str(model_dir), worker_id="w-ps", torch_threads=1)
    )
    yield executor
    executor.close_sync()


def open_on(
    executor: PersistentWorkerExecutor, session_id: str, face: int = 1, seed: int = 7, **fields: Any
) -> GroupSession:
    image = fields.pop("reference_image", None)
    request = OpenRequest(
        session_id=session_id,
        model=fields.pop("model", MODEL),
        reference_image=png(portrait(face)) if image is None else image,
        config=fields.pop("config", {"seed": float(seed)}),  # Struct numbers arrive as floats
        **fields,
    )
    session = executor.open_session(request)
    assert isinstance(session, GroupSession)
    return session


def alone(pipe: TalkingHeadPipeline, face: int, seed: int, audio: list[np.ndarray]) -> list[Any]:
    """The chunks the in-process pipeline makes for `audio` (pushed in order) from the same portrait
    (decoded from the same PNG bytes) and seed."""
    session = pipe.open(Image.open(io.BytesIO(png(portrait(face)))).convert("RGB"), seed)
    try:
        return [session.push(pcm) for pcm in audio]
    finally:
        session.close()


def assert_same(got: Any, want: Any) -> int:
    """`got` (a ChunkOut) is `want` (a pipeline Chunk) within MAX_DIFF; returns the largest difference."""
    assert got.frames.dtype == np.uint8 and got.frames.shape == (FRAMES, 64, 64, 3)
    diff = int(np.abs(got.frames.astype(np.int16) - want.frames.astype(np.int16)).max())
    assert diff <= MAX_DIFF, f"frames differ by {diff}/255"
    assert np.array_equal(got.audio, want.audio) and got.audio.dtype == np.int16
    assert got.pts_ms == want.pts_ms
    return diff


def refusal(call: Any) -> SessionRefused:
    with pytest.raises(SessionRefused) as caught:
        call()
    return caught.value


def test_a_session_streams_the_pipelines_frames_with_the_decode_split(
    pw: PersistentWorkerExecutor, pipe: TalkingHeadPipeline
) -> None:
    audio = [speech(i) for i in range(3)]
    session = open_on(pw, "s-1")  # starts the group
    assert MODEL.id in pw.loaded_models()
    geometry = session.geometry
    assert (geometry.sample_rate, geometry.chunk_samples, geometry.fps) == (RATE, SAMPLES, 25.0)
    assert (geometry.frames_per_chunk, geometry.width, geometry.height) == (FRAMES, 64, 64)
    want = alone(pipe, 1, 7, audio)
    diffs = []
    for index, pcm in enumerate(audio):
        started = time.perf_counter()
        chunk = session.push(pcm)
        elapsed = time.perf_counter() - started
        diffs.append(assert_same(chunk, want[index]))
        assert chunk.pts_ms == index * CHUNK_MS
        # What a user of the group gets from its 2 ranks: each decoded half of the frames.
        assert session.last_reply["frames_per_rank"] == [14, 14]
        print(f"chunk {index}: {elapsed * 1000:.0f} ms, max diff {diffs[-1]}/255")
    # The motion carries from chunk to chunk (on both ranks alike): chunk 2 is not chunk 0 again.
    assert not np.array_equal(want[0].frames, want[2].frames)
    session.close()
    session.close()  # idempotent
    closed = refusal(lambda: session.push(audio[0]))
    assert closed.code == "FAILED_PRECONDITION" and closed.field == "session"


def test_two_open_sessions_stay_independent(pw: PersistentWorkerExecutor, pipe: TalkingHeadPipeline) -> None:
    audio = {"a": [speech(10), speech(11)], "b": [speech(20), speech(21)]}
    sessions = {"a": open_on(pw, "s-a", face=1, seed=7), "b": open_on(pw, "s-b", face=2, seed=11)}
    got: dict[str, list[Any]] = {"a": [], "b": []}
    errors: list[BaseException] = []

    def feed(name: str) -> None:
        try:
            got[name] = [sessions[name].push(pcm) for pcm in audio[name]]
        except BaseException as exc:
            errors.append(exc)

    # Pushed from two threads at once, as the daemon's relay does: the group serialises them.
    threads = [threading.Thread(target=feed, args=(name,)) for name in sessions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    for name, face, seed in (("a", 1, 7), ("b", 2, 11)):
        for chunk, expected in zip(got[name], alone(pipe, face, seed, audio[name]), strict=True):
            assert_same(chunk, expected)
        sessions[name].close()
    assert not np.array_equal(got["a"][0].frames, got["b"][0].frames)


def test_a_bad_chunk_is_refused_and_the_session_serves_on(
    pw: PersistentWorkerExecutor, pipe: TalkingHeadPipeline
) -> None:
    session = open_on(pw, "s-bad-audio")
    short = refusal(lambda: session.push(speech(0)[:1000]))
    assert (short.code, short.field) == ("INVALID_ARGUMENT", "pcm")
    assert "17920 samples" in short.message and "got 1000" in short.message
    stereo = refusal(lambda: session.push(np.zeros((SAMPLES, 2), np.int16)))
    assert (stereo.code, stereo.field) == ("INVALID_ARGUMENT", "pcm")
    # Nothing moved: the next good chunk is the session's first (index 0, pts 0).
    assert_same(session.push(speech(0)), alone(pipe, 1, 7, [speech(0)])[0])
    session.close()


def test_bad_open_requests_are_refused_naming_the_field(pw: PersistentWorkerExecutor) -> None:
    broken = refusal(lambda: open_on(pw, "s-x", reference_image=b"not an image"))
    assert (broken.code, broken.field) == ("INVALID_ARGUMENT", "reference_image")
    empty = refusal(lambda: open_on(pw, "s-x", reference_image=b""))
    assert (empty.code, empty.field) == ("INVALID_ARGUMENT", "reference_image")
    seed = refusal(lambda: open_on(pw, "s-x", config={"seed": 1.5}))
    assert (seed.code, seed.field) == ("INVALID_ARGUMENT", "config.seed")
    unknown = refusal(lambda: open_on(pw, "s-x", config={"voice": "alto"}))
    assert (unknown.code, unknown.field) == ("INVALID_ARGUMENT", "config.voice")
    size = refusal(lambda: open_on(pw, "s-x", width=128))
    assert (size.code, size.field) == ("INVALID_ARGUMENT", "width") and "64" in size.message
    sd = t.ModelSpec(id="tiny-sd-pw", source="builtin:tiny-sd", execution_mode="persistent_worker")
    other = refusal(lambda: open_on(pw, "s-x", model=sd))
    assert (other.code, other.field) == ("FAILED_PRECONDITION", "model")
    split = dataclasses.replace(MODEL, runtime={**MODEL.runtime, "parallel": "cfg"})
    parallel = refusal(lambda: open_on(pw, "s-x", model=split))
    assert (parallel.code, parallel.field) == ("FAILED_PRECONDITION", "model")
    assert "runtime.parallel" in parallel.message
    # None of them left a session behind: the same id opens now, and the group still serves.
    session = open_on(pw, "s-x")
    assert session.push(speech(3)).frames.shape == (FRAMES, 64, 64, 3)
    session.close()


def test_a_killed_rank_fails_the_push_unavailable_and_a_new_session_works(
    pw: PersistentWorkerExecutor, pipe: TalkingHeadPipeline
) -> None:
    session = open_on(pw, "s-doomed")
    bystander = open_on(pw, "s-bystander", face=2)
    group = pw.group(MODEL.id)
    assert group is not None
    before = group.pids()  # the torchrun agent, rank 0, rank 1
    session.push(speech(0))
    # Rank 1 dies while a push runs (its denoise or its share of the decode): that push, or if
    # the kill lands just after it, the next one, fails; nothing hangs.
    threading.Timer(0.05, os.kill, (before[2], signal.SIGKILL)).start()
    pushed = 0
    with pytest.raises(SessionRefused) as caught:
        for index in range(1, 4):
            session.push(speech(index))
            pushed += 1
    lost = caught.value
    assert pushed <= 1
    assert lost.code == "UNAVAILABLE" and "rank" in lost.message and "exited" in lost.message, lost.message
    print(lost.message)
    after = refusal(lambda: session.push(speech(1)))  # the session is over, not hung
    assert after.code == "FAILED_PRECONDITION" and after.field == "session"
    deadline = time.monotonic() + 10
    while any(pid_alive(p) for p in before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(pid_alive(p) for p in before), "the rest of the dead group is stopped"
    session.close()  # the state is gone with the group: closing is still fine

    fresh = open_on(pw, "s-after")  # waits for the restart
    assert_same(fresh.push(speech(0)), alone(pipe, 1, 7, [speech(0)])[0])
    assert set(group.pids()).isdisjoint(before) and len(group.pids()) == 3
    # The other session open on the dead group lost its state too: it says so, on the new group.
    gone = refusal(lambda: bystander.push(speech(0)))
    assert gone.code == "UNAVAILABLE" and "exited after session 's-bystander' opened" in gone.message
    bystander.close()
    fresh.close()


def test_a_job_on_the_streaming_model_is_refused(pw: PersistentWorkerExecutor) -> None:
    work = make_assignment(model_id=MODEL.id, source=MODEL.source)
    work.model.pipeline_class, work.model.runtime = MODEL.pipeline_class, dict(MODEL.runtime)
    (outcome,) = pw.run_sync(work, lambda event: None, CancelFlags())
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("FAILED_PRECONDITION", "model")
    assert "realtime sessions" in outcome.error.message
