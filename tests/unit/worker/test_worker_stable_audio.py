"""Stable Audio text2audio through the real legacy_call executor, on `builtin:tiny-stable-audio`.

The tiny model makes stereo 8 kHz clips of up to 2.048 s (64 latents x a 256-sample hop). The
request's duration_ms is the pipeline's `audio_end_in_s`; num_outputs its
`num_waveforms_per_prompt`; `output.audios` become WAV, FLAC or MP3 artifacts that carry their
sample rate and channels. A duration the model cannot make is INVALID_ARGUMENT naming
duration_ms before the call, never INTERNAL (the pipeline's own ValueError).
"""

from __future__ import annotations

import hashlib
import io
import wave

import av
import numpy as np
import pytest
from worker_testing import (
    AUDIO,
    TASKS,
    Family,
    only_result,
    refusal,
    run_assignment,
    run_family,
)

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.export import audio as audio_export
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

# torchsde's Brownian tree (Stable Audio's scheduler) warns on float32 rounding of its sigma range.
pytestmark = pytest.mark.filterwarnings("ignore:Should have:UserWarning")
RATE, CHANNELS, HOP, LONGEST_MS = 8000, 2, 256, 2048
STABLE_AUDIO = Family(
    "tiny-stable-audio",
    "StableAudioPipeline",
    (t.Task.TEXT2AUDIO,),
    {"num_inference_steps": 4, "guidance_scale": 3.0, "seed": 7, "duration_ms": 1500},
)


def run(executor: LegacyCallExecutor, fmt: str = "", **fields: object) -> ItemOutcome:
    return run_family(executor, STABLE_AUDIO, output=types_pb2.OutputOptions(format=fmt), **fields)


def wav_samples(data: bytes) -> tuple[int, np.ndarray]:
    """(sample rate, samples shaped (channels, samples)) of a 16-bit WAV."""
    with wave.open(io.BytesIO(data)) as reader:
        assert reader.getsampwidth() == 2
        raw = np.frombuffer(reader.readframes(reader.getnframes()), dtype="<i2")
        return reader.getframerate(), raw.reshape(-1, reader.getnchannels()).T


def decoded_audio(data: bytes) -> tuple[str, int, np.ndarray]:
    """(codec, sample rate, int16 samples shaped (channels, samples)) of a FLAC or MP3, by PyAV."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        codec, rate = stream.codec_context.name, stream.rate
        resampler = av.AudioResampler(format="s16p", layout=stream.layout.name, rate=rate)
        chunks = [
            out.to_ndarray() for frame in container.decode(audio=0) for out in resampler.resample(frame)
        ]
        chunks += [out.to_ndarray() for out in resampler.resample(None)]
    return codec, rate, np.concatenate(chunks, axis=1)


def assignment(durations: list[int], steps: int = 4) -> gateway_pb2.Assignment:
    """One assignment with a job per duration (job-0, job-1, ...)."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-audio",
        model=models_pb2.ModelSpec(
            id=STABLE_AUDIO.model,
            source=f"builtin:{STABLE_AUDIO.model}",
            pipeline_class=STABLE_AUDIO.pipeline_class,
            execution_mode="legacy_call",
            tasks=[TASKS[t.Task.TEXT2AUDIO]],
        ),
    )
    for index, duration in enumerate(durations):
        request = types_pb2.GenerateRequest(
            task=TASKS[t.Task.TEXT2AUDIO],
            model=STABLE_AUDIO.model,
            prompt=f"rain on a tin roof {index}",
            num_inference_steps=steps,
            guidance_scale=3.0,
            seed=7,
            duration_ms=duration,
        )
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    return msg


@pytest.fixture(scope="module")
def clips(executor: LegacyCallExecutor) -> dict[str, t.GenerateResult]:
    """Seed 7 twice and seed 8 once as WAV; seed 7 twice as FLAC and as MP3."""
    return {
        "first": only_result(run(executor)),
        "again": only_result(run(executor)),
        "other-seed": only_result(run(executor, seed=8)),
        "flac": only_result(run(executor, "flac")),
        "flac-again": only_result(run(executor, "flac")),
        "mp3": only_result(run(executor, "mp3")),
        "mp3-again": only_result(run(executor, "mp3")),
    }


def test_text2audio_runs_the_stable_audio_pipeline(clips: dict[str, t.GenerateResult]) -> None:
    report = clips["first"].report
    assert report.task is t.Task.TEXT2AUDIO
    assert report.pipeline_class == "StableAudioPipeline"
    config = report.config_resolved
    assert config["audio_end_in_s"] == 1.5 and config["audio_start_in_s"] == 0.0
    assert (config["sample_rate"], config["channels"], config["duration_ms"]) == (RATE, CHANNELS, 1500)
    assert "width" not in config and "height" not in config


def test_wav_has_the_requested_duration_rate_and_channels(clips: dict[str, t.GenerateResult]) -> None:
    [clip] = clips["first"].artifacts
    assert (clip.kind, clip.mime_type, clip.file_name[-4:]) == (t.MediaKind.AUDIO, "audio/wav", ".wav")
    assert (clip.sample_rate, clip.channels, clip.duration_ms) == (RATE, CHANNELS, 1500)
    assert clip.sha256 == hashlib.sha256(clip.data).hexdigest()
    rate, samples = wav_samples(clip.data)
    assert (rate, samples.shape[0]) == (clip.sample_rate, clip.channels)
    assert abs(samples.shape[1] - 1500 * RATE // 1000) < HOP
    assert samples.shape[1] * 1000 // rate == clip.duration_ms
    assert samples.std() > 100, "not silence"
    assert np.abs(samples[0].astype(float) - samples[1]).mean() > 1, "two different channels"


def test_same_seed_same_bytes_other_seed_other_clip(clips: dict[str, t.GenerateResult]) -> None:
    first, again, other = (clips[key].artifacts[0].sha256 for key in ("first", "again", "other-seed"))
    assert first == again
    assert first != other
    for fmt in ("flac", "mp3"):
        assert clips[fmt].artifacts[0].data == clips[f"{fmt}-again"].artifacts[0].data, fmt


def test_flac_decodes_to_the_wav_samples(clips: dict[str, t.GenerateResult]) -> None:
    [flac] = clips["flac"].artifacts
    assert (flac.mime_type, flac.sample_rate, flac.channels) == ("audio/flac", RATE, CHANNELS)
    assert flac.duration_ms == 1500
    codec, rate, samples = decoded_audio(flac.data)
    assert (codec, rate, samples.shape[0]) == ("flac", RATE, CHANNELS)
    _, wav = wav_samples(clips["first"].artifacts[0].data)
    np.testing.assert_array_equal(samples, wav)  # lossless: the very same 16-bit samples


def test_mp3_decodes_with_the_rate_channels_and_duration(clips: dict[str, t.GenerateResult]) -> None:
    [mp3] = clips["mp3"].artifacts
    assert (mp3.mime_type, mp3.sample_rate, mp3.channels) == ("audio/mpeg", RATE, CHANNELS)
    assert mp3.duration_ms == 1500
    assert b"Lavf6" not in mp3.data, "no encoder version tag (bitexact)"
    codec, rate, samples = decoded_audio(mp3.data)
    assert (codec, rate, samples.shape[0]) == ("mp3float", RATE, CHANNELS)
    assert abs(samples.shape[1] - 1500 * RATE // 1000) < HOP
    _, wav = wav_samples(clips["first"].artifacts[0].data)
    assert np.corrcoef(samples[0, : wav.shape[1]], wav[0, : samples.shape[1]])[0, 1] > 0.5, "the same clip"


def test_two_outputs_are_two_clips_with_their_seeds(executor: LegacyCallExecutor) -> None:
    result = only_result(run(executor, num_outputs=2, duration_ms=1000))
    first, second = result.artifacts
    assert (first.seed, second.seed) == (7, 8)
    assert (first.index, second.index) == (0, 1)
    assert first.duration_ms == second.duration_ms == 1000
    assert first.sha256 != second.sha256
    assert result.report.config_resolved["num_outputs"] == 2


def test_no_duration_makes_the_longest_clip(executor: LegacyCallExecutor) -> None:
    [clip] = only_result(run(executor, duration_ms=None)).artifacts
    assert clip.duration_ms == LONGEST_MS
    assert wav_samples(clip.data)[1].shape[1] == LONGEST_MS * RATE // 1000


def test_the_longest_duration_runs(executor: LegacyCallExecutor) -> None:
    [clip] = only_result(run(executor, duration_ms=LONGEST_MS)).artifacts
    assert clip.duration_ms == LONGEST_MS


@pytest.mark.parametrize("duration_ms", [LONGEST_MS + 1, 60_000])
def test_a_duration_past_the_model_is_invalid_argument(
    executor: LegacyCallExecutor, duration_ms: int
) -> None:
    outcome = run(executor, duration_ms=duration_ms)
    assert refusal(outcome) == ("INVALID_ARGUMENT", "duration_ms")
    assert f"at most {LONGEST_MS}" in outcome.error.message


def test_a_duration_under_one_sample_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    assert refusal(run(executor, duration_ms=0)) == ("INVALID_ARGUMENT", "duration_ms")


def test_an_unknown_audio_format_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    outcome = run(executor, "ogg")
    assert refusal(outcome) == ("INVALID_ARGUMENT", "output.format")
    assert "wav, flac, mp3" in outcome.error.message


def test_extras_may_not_move_the_clip_window(executor: LegacyCallExecutor) -> None:
    for key in ("audio_end_in_s", "audio_start_in_s"):
        assert refusal(run(executor, extra={key: 1.0})) == ("INVALID_ARGUMENT", f"extra.{key}")


def test_an_audio_input_is_refused_naming_the_input(executor: LegacyCallExecutor) -> None:
    outcome = run_family(executor, STABLE_AUDIO, inputs=((AUDIO, b"not a wav file"),))
    assert refusal(outcome) == ("INVALID_ARGUMENT", "inputs[0]")


def test_jobs_of_two_durations_in_one_assignment_each_get_theirs(executor: LegacyCallExecutor) -> None:
    outcomes, _ = run_assignment(executor, assignment_from_proto(assignment([1000, 1500])))
    durations = [only_result(o).artifacts[0].duration_ms for o in outcomes]
    assert durations == [1000, 1500]


def test_steps_report_progress_and_a_cancel_stops_the_call(live_executor: LegacyCallExecutor) -> None:
    """Stable Audio has only the older `callback` hook: progress and cancellation go through it."""
    _, events = run_assignment(live_executor, assignment_from_proto(assignment([500])))
    steps = [e.progress.step for e in events if e.kind is t.EventKind.PROGRESS]
    assert steps == [1, 2, 3, 4]

    def cancel_at_step_2(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.PROGRESS and event.progress.step == 2:
            flags.request(event.job_id, "CANCELLED")

    outcomes, events = run_assignment(
        live_executor, assignment_from_proto(assignment([500], steps=200)), on_event=cancel_at_step_2
    )
    assert refusal(outcomes[0])[0] == "CANCELLED"
    assert len([e for e in events if e.kind is t.EventKind.PROGRESS]) < 200


def test_mp3_refuses_a_sample_rate_it_does_not_have() -> None:
    assert "mp3 has no 7000 Hz" in audio_export.format_problem("mp3", 7000, 2)
    assert audio_export.format_problem("flac", 7000, 2) == ""
    clip = audio_export.Waveform(np.zeros((2, 700), np.float32), 7000)
    with pytest.raises(ValueError, match="mp3 has no 7000 Hz"):
        audio_export.encode_audio(clip, "mp3")
    assert wav_samples(audio_export.encode_audio(clip, "wav"))[0] == 7000
