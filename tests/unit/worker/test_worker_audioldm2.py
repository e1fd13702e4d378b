"""AudioLDM 2 text2audio through the real legacy_call executor, on `builtin:tiny-audioldm2`.

The tiny model makes mono 16 kHz clips (10 ms mel frames, 2 to a latent frame). The request's
duration_ms is the pipeline's `audio_length_in_s` (it cuts the waveform to exactly that many
samples); num_outputs its `num_waveforms_per_prompt`. A duration under one latent frame (20 ms)
is INVALID_ARGUMENT naming duration_ms before the call, never INTERNAL (the pipeline's ValueError).
"""

from __future__ import annotations

import hashlib
import io
import wave

import av
import numpy as np
import pytest
from worker_testing import Family, only_result, refusal, run_family

from omnirt import types as t
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt.v1 import types_pb2
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

RATE = 16000
AUDIOLDM2 = Family(
    "tiny-audioldm2",
    "AudioLDM2Pipeline",
    (t.Task.TEXT2AUDIO,),
    {"num_inference_steps": 2, "guidance_scale": 3.5, "seed": 7, "duration_ms": 500},
)


def run(executor: LegacyCallExecutor, fmt: str = "", **fields: object) -> ItemOutcome:
    return run_family(executor, AUDIOLDM2, output=types_pb2.OutputOptions(format=fmt), **fields)


def wav_samples(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, samples shaped (channels, samples)) of a 16-bit WAV."""
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getsampwidth() == 2
        raw = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
        return reader.getframerate(), raw.reshape(-1, reader.getnchannels()).T


@pytest.fixture(scope="module")
def clips(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """500 ms with seed 7 twice, seed 8, another prompt, and 250 ms."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "other-prompt": only_result(run(executor, prompt="rain on the sea at night")),
        "250ms": only_result(run(executor, duration_ms=250)),
    }


def test_text2audio_runs_the_audioldm2_pipeline(clips: dict[str, t.GenerateResult]) -> None:
    report = clips["first"].report
    assert (report.task, report.pipeline_class) == (t.Task.TEXT2AUDIO, "AudioLDM2Pipeline")
    config = report.config_resolved
    assert config["audio_length_in_s"] == 0.5
    assert (config["sample_rate"], config["channels"], config["duration_ms"]) == (RATE, 1, 500)


@pytest.mark.parametrize(("key", "duration_ms"), [("first", 500), ("250ms", 250)])
def test_wav_is_16khz_mono_of_the_requested_duration(
    clips: dict[str, t.GenerateResult], key: str, duration_ms: int
) -> None:
    [clip] = clips[key].artifacts
    assert (clip.kind, clip.mime_type, clip.file_name[-4:]) == (t.MediaKind.AUDIO, "audio/wav", ".wav")
    assert (clip.sample_rate, clip.channels, clip.duration_ms) == (RATE, 1, duration_ms)
    assert clip.sha256 == hashlib.sha256(clip.data).hexdigest()
    rate, samples = wav_samples(clip.data)
    # The pipeline cuts the vocoder's waveform to exactly the asked length.
    assert (rate, samples.shape) == (RATE, (1, duration_ms * RATE // 1000))
    assert samples.std() > 100, "not silence"


def test_same_seed_same_bytes_other_seed_or_prompt_other_clip(clips: dict[str, t.GenerateResult]) -> None:
    first, again, other_seed, other_prompt = (
        clips[key].artifacts[0].sha256 for key in ("first", "again", "other-seed", "other-prompt")
    )
    assert first == again
    assert first not in (other_seed, other_prompt)
    _, a = wav_samples(clips["first"].artifacts[0].data)
    _, b = wav_samples(clips["other-seed"].artifacts[0].data)
    assert np.abs(a.astype(float) - b).mean() > 1, "the seed changes the samples, not a bit or two"


def test_two_outputs_are_the_clips_of_two_seeds(
    executor: LegacyCallExecutor, clips: dict[str, t.GenerateResult]
) -> None:
    result = only_result(run(executor, num_outputs=2))
    assert [clip.seed for clip in result.artifacts] == [7, 8]
    # Each as it is alone, to the rounding of a batch of two (measured: a few samples 1 LSB off).
    for clip, alone in zip(result.artifacts, (clips["first"], clips["other-seed"]), strict=True):
        together, single = wav_samples(clip.data)[1], wav_samples(alone.artifacts[0].data)[1]
        assert together.shape == single.shape
        assert np.abs(together.astype(int) - single).max() <= 1
    assert result.artifacts[0].sha256 != result.artifacts[1].sha256


def test_mp3_takes_the_16khz_rate(executor: LegacyCallExecutor) -> None:
    [clip] = only_result(run(executor, "mp3", duration_ms=250)).artifacts
    assert (clip.mime_type, clip.sample_rate, clip.channels) == ("audio/mpeg", RATE, 1)
    with av.open(io.BytesIO(clip.data)) as container:
        stream = container.streams.audio[0]
        assert stream.rate == RATE


def test_a_duration_under_one_latent_frame_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    outcome = run(executor, duration_ms=10)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "duration_ms")
    assert outcome.error is not None and "at least 20" in outcome.error.message
