"""VITS text-to-speech (text2audio) through the real legacy_call executor, on `builtin:tiny-vits`.

The tiny model is a transformers `VitsModel` in an MMS-TTS hub checkpoint's layout, loaded by
the model cache as a `SpeechPipeline` (omnirt.worker.pipelines.speech): mono 16 kHz speech as
long as its text makes it. The seed makes a clip (VITS samples noise from torch's global RNG,
seeded per output); `extra.speed` is its speaking rate. Fields of diffusion pipelines are
refused naming the field; every audio format decodes back to the clip.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import av
import numpy as np
import pytest
from test_worker_stable_audio import decoded_audio, wav_samples
from worker_testing import Family, only_result, refusal, run_assignment, run_family

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.export import audio as audio_export
from omnirt.worker.modes.legacy_call import LegacyCallExecutor

RATE, HOP = 16000, 256  # the tiny model's sample rate and samples per spectrogram frame
VITS = Family("tiny-vits", "VitsModel", (t.Task.TEXT2AUDIO,), {"seed": 7})
TEXT = "hello there my dog is cute"


def run(executor: LegacyCallExecutor, fmt: str = "", prompt: str = TEXT, **fields: object) -> ItemOutcome:
    return run_family(executor, VITS, prompt=prompt, output=types_pb2.OutputOptions(format=fmt), **fields)


def clip_of(outcome: ItemOutcome) -> t.Artifact:
    [clip] = only_result(outcome).artifacts
    return clip


@pytest.fixture(scope="module")
def clips(executor: LegacyCallExecutor) -> dict[str, t.Artifact]:
    """Seed 7 twice and seed 8 once as WAV; seed 7 twice in every other format."""
    made = {"first": clip_of(run(executor)), "again": clip_of(run(executor))}
    made["other-seed"] = clip_of(run(executor, seed=8))
    for fmt in ("pcm", "flac", "mp3", "opus", "aac"):
        made[fmt], made[f"{fmt}-again"] = clip_of(run(executor, fmt)), clip_of(run(executor, fmt))
    return made


def test_the_tiny_model_is_a_transformers_checkpoint(executor: LegacyCallExecutor, clips: object) -> None:
    folder = Path(executor.config.model_dir) / "tiny-vits"
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "vocab.json", "tokenizer_config.json"} <= names
    assert "model_index.json" not in names


def test_text2audio_runs_the_vits_model(executor: LegacyCallExecutor) -> None:
    report = only_result(run(executor)).report
    assert report.task is t.Task.TEXT2AUDIO
    assert report.pipeline_class == "VitsModel"
    config = report.config_resolved
    assert (config["sample_rate"], config["channels"]) == (RATE, 1)
    assert not {"width", "height", "audio_end_in_s"} & set(config)


def test_wav_is_16_khz_mono_speech_of_the_stated_length(clips: dict[str, t.Artifact]) -> None:
    clip = clips["first"]
    assert (clip.kind, clip.mime_type, clip.file_name[-4:]) == (t.MediaKind.AUDIO, "audio/wav", ".wav")
    rate, samples = wav_samples(clip.data)
    assert (rate, samples.shape[0]) == (clip.sample_rate, clip.channels) == (RATE, 1)
    assert samples.shape[1] % HOP == 0, "whole spectrogram frames"
    assert clip.duration_ms == round(samples.shape[1] * 1000 / RATE)
    assert clip.duration_ms > 500
    assert samples.std() > 100, "not silence"


def test_same_seed_same_bytes_other_seed_other_clip(clips: dict[str, t.Artifact]) -> None:
    assert clips["first"].sha256 == clips["again"].sha256
    assert clips["first"].sha256 != clips["other-seed"].sha256
    for fmt in ("pcm", "flac", "mp3", "opus", "aac"):
        assert clips[fmt].data == clips[f"{fmt}-again"].data, fmt


def test_a_longer_text_makes_a_longer_clip(
    executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    short = clip_of(run(executor, prompt="hello"))
    longer = clip_of(run(executor, prompt=TEXT + " and it likes to run around the park"))
    assert short.duration_ms < clips["first"].duration_ms < longer.duration_ms


def test_speed_changes_the_speaking_rate(executor: LegacyCallExecutor, clips: dict[str, t.Artifact]) -> None:
    normal = clips["first"].duration_ms
    fast = clip_of(run(executor, extra={"speed": 2.0})).duration_ms
    slow = clip_of(run(executor, extra={"speed": 0.5})).duration_ms
    assert fast < 0.75 * normal and slow > 1.5 * normal, (fast, normal, slow)
    assert clip_of(run(executor, extra={"speed": 1.0})).sha256 == clips["first"].sha256


def test_noise_scale_changes_the_clip_not_its_length(
    executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    quiet = clip_of(run(executor, extra={"noise_scale": 0.0}))
    assert quiet.sha256 != clips["first"].sha256
    assert quiet.duration_ms == clips["first"].duration_ms  # the durations' noise is another scale


def test_pcm_and_flac_hold_the_wav_samples(clips: dict[str, t.Artifact]) -> None:
    _, wav = wav_samples(clips["first"].data)
    pcm = clips["pcm"]
    assert (pcm.mime_type, pcm.file_name[-4:], pcm.sample_rate, pcm.channels) == (
        "audio/pcm",
        ".pcm",
        RATE,
        1,
    )
    assert pcm.duration_ms == clips["first"].duration_ms
    np.testing.assert_array_equal(np.frombuffer(pcm.data, dtype="<i2")[None, :], wav)
    with av.open(io.BytesIO(pcm.data), format="s16le", options={"sample_rate": str(RATE)}) as container:
        decoded = np.concatenate([f.to_ndarray() for f in container.decode(audio=0)], axis=1)
    np.testing.assert_array_equal(decoded, wav)  # what ffmpeg reads as raw s16le
    codec, rate, samples = decoded_audio(clips["flac"].data)
    assert (codec, rate) == ("flac", RATE)
    np.testing.assert_array_equal(samples, wav)


@pytest.mark.parametrize(
    ("fmt", "mime", "codec", "decoded_rate", "delay"),
    [
        ("mp3", "audio/mpeg", "mp3float", RATE, 0),
        ("opus", "audio/ogg", "opus", 48000, 0),  # Opus always decodes at 48 kHz
        ("aac", "audio/aac", "aac", RATE, 1024),  # ADTS has no field for the encoder's priming
    ],
)
def test_lossy_formats_decode_to_the_clip(
    clips: dict[str, t.Artifact], fmt: str, mime: str, codec: str, decoded_rate: int, delay: int
) -> None:
    artifact = clips[fmt]
    assert (artifact.mime_type, artifact.sample_rate, artifact.channels) == (mime, RATE, 1)
    assert artifact.duration_ms == clips["first"].duration_ms
    assert not re.search(rb"Lav[fc]\d", artifact.data), "no encoder version tag (bitexact)"
    got_codec, rate, samples = decoded_audio(artifact.data)
    assert (got_codec, rate, samples.shape[0]) == (codec, decoded_rate, 1)
    _, wav = wav_samples(clips["first"].data)
    expected = wav.shape[1] * decoded_rate // RATE
    assert (
        expected <= samples.shape[1] - delay * decoded_rate // RATE <= expected + 2048 * decoded_rate // RATE
    )
    step = decoded_rate // RATE
    heard = samples[0, delay : delay + wav.shape[1] * step : step].astype(float)
    n = min(len(heard), wav.shape[1])
    assert 0.3 < heard.std() / wav.std() < 3, "about as loud"
    if fmt != "opus":  # libopus's own lookahead shifts the waveform a little more
        assert np.corrcoef(heard[:n], wav[0, :n])[0, 1] > 0.5, "the same clip"


def test_opus_refuses_a_rate_it_does_not_take() -> None:
    assert "opus has no 44100 Hz" in audio_export.format_problem("opus", 44100, 2)
    assert "use wav, flac, mp3, pcm, aac" in audio_export.format_problem("opus", 44100, 2)
    assert audio_export.format_problem("aac", 44100, 2) == ""
    assert "aac has no 7000 Hz" in audio_export.format_problem("aac", 7000, 1)
    clip = audio_export.Waveform(np.zeros((1, 700), np.float32), 7000)
    assert audio_export.encode_audio(clip, "pcm") == bytes(1400)


def test_two_outputs_are_two_clips_each_as_alone(
    executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    result = only_result(run(executor, num_outputs=2))
    first, second = result.artifacts
    assert (first.seed, second.seed) == (7, 8)
    assert first.sha256 == clips["first"].sha256
    assert second.sha256 == clips["other-seed"].sha256


def test_a_batch_of_two_jobs_gives_each_its_own_clip(
    executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    model = models_pb2.ModelSpec(
        id=VITS.model,
        source=f"builtin:{VITS.model}",
        pipeline_class=VITS.pipeline_class,
        execution_mode="legacy_call",
        tasks=[types_pb2.TASK_TEXT2AUDIO],
    )
    msg = gateway_pb2.Assignment(assignment_id="as-tts", model=model, batch_group_id="bg-tts")
    for index, prompt in enumerate((TEXT, "hello")):
        request = types_pb2.GenerateRequest(
            task=types_pb2.TASK_TEXT2AUDIO, model=VITS.model, prompt=prompt, seed=7
        )
        msg.items.add(job_id=f"job-{index}", attempt=1, request=request)
    outcomes, _ = run_assignment(executor, assignment_from_proto(msg))
    first, second = (clip_of(o) for o in outcomes)
    assert first.sha256 == clips["first"].sha256, "a prompt in a batch sounds as alone"
    assert second.duration_ms < first.duration_ms


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"duration_ms": 1000}, "duration_ms"),
        ({"num_inference_steps": 4}, "num_inference_steps"),
        ({"guidance_scale": 3.0}, "guidance_scale"),
        ({"width": 64}, "width"),
        ({"height": 64}, "height"),
        ({"negative_prompt": "noise"}, "negative_prompt"),
        ({"scheduler": "DDIMScheduler"}, "scheduler"),
        ({"extra": {"speed": 4.5}}, "extra.speed"),
        ({"extra": {"speed": 0.2}}, "extra.speed"),
        ({"extra": {"speed": "fast"}}, "extra.speed"),
        ({"extra": {"noise_scale": -1}}, "extra.noise_scale"),
        ({"extra": {"speaking_rate": 2}}, "extra.speaking_rate"),
    ],
)
def test_what_a_tts_model_cannot_do_is_refused_naming_the_field(
    executor: LegacyCallExecutor, fields: dict, field: str
) -> None:
    assert refusal(run(executor, **fields)) == ("INVALID_ARGUMENT", field)


@pytest.mark.parametrize("prompt", ["", "   ", "!!! ???", "a" * 4097])
def test_a_prompt_it_cannot_read_is_refused(executor: LegacyCallExecutor, prompt: str) -> None:
    assert refusal(run(executor, prompt=prompt)) == ("INVALID_ARGUMENT", "prompt")


def test_a_load_option_it_cannot_apply_is_refused_naming_it(executor: LegacyCallExecutor) -> None:
    outcome = run(executor, extra={"runtime": {"torch_compile": True}})
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "runtime.torch_compile" in outcome.error.message


def test_weights_are_identical_on_every_build(
    tmp_path: Path, executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    from omnirt.worker.tiny import vits

    vits.build_tiny_vits(tmp_path / "again")
    built = Path(executor.config.model_dir) / "tiny-vits"
    for name in ("model.safetensors", "vocab.json", "config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (built / name).read_bytes(), name


def run_folder(executor: LegacyCallExecutor, folder: Path) -> ItemOutcome:
    """One job of a model loaded from a local folder, as a hub checkpoint's download is."""
    model = models_pb2.ModelSpec(
        id="my-tts",
        source=str(folder),
        pipeline_class="VitsModel",
        execution_mode="legacy_call",
        tasks=[types_pb2.TASK_TEXT2AUDIO],
    )
    msg = gateway_pb2.Assignment(assignment_id="as-folder", model=model)
    request = types_pb2.GenerateRequest(task=types_pb2.TASK_TEXT2AUDIO, model="my-tts", prompt=TEXT, seed=7)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def test_a_checkpoint_folder_loads_like_the_builtin_and_a_phonemizing_one_is_refused(
    tmp_path: Path, executor: LegacyCallExecutor, clips: dict[str, t.Artifact]
) -> None:
    import json
    import shutil

    folder = tmp_path / "mms-tts-like"
    shutil.copytree(Path(executor.config.model_dir) / "tiny-vits", folder)
    assert clip_of(run_folder(executor, folder)).sha256 == clips["first"].sha256
    config_file = tmp_path / "phonemes" / "tokenizer_config.json"
    shutil.copytree(folder, config_file.parent)
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "phonemize": True}))
    outcome = run_folder(executor, config_file.parent)
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "phonemizer package" in outcome.error.message
