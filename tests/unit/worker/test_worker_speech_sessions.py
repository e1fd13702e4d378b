"""Realtime sessions that take text, hosted by a real worker process, with this test as the
controller (the `Gateway` and `Peer` of test_worker_sessions).

The speech model is tiny-vits (random weights, 16 kHz: about 1.2 s of speech for "Hello
there.", some 60 ms of CPU a sentence); the talking head is the tiny one (28 frames a 1.12 s
chunk). A speech session streams 0.5 s chunks (8,000 samples) of audio and no frames.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import struct_pb2

from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt.v1 import models_pb2, realtime_pb2
from tests.unit.worker.test_worker_sessions import Gateway, Peer, chunks, hosted, last, speech

SPEECH_CHUNK, RATE = 8000, 16000
HEAD_CHUNK, FRAMES = 17920, 28

SPEECH = models_pb2.ModelSpec(
    id="tiny-vits-stream",
    execution_mode="legacy_call",
    source="builtin:tiny-vits",
    pipeline_class="VitsModel",
    streaming=True,
)
HEAD_TTS = models_pb2.ModelSpec(
    id="tiny-talking-head-tts",
    execution_mode="legacy_call",
    source="builtin:tiny-talking-head",
    pipeline_class="TalkingHeadPipeline",
    streaming=True,
    runtime=struct_pb2.Struct(fields={"speech_source": struct_pb2.Value(string_value="builtin:tiny-vits")}),
)
# Enough sentences that their speech (about 1-4 s each) is far more than the 4 chunks (2 s) a
# session buffers: the first chunks must leave before the last sentences can be made.
LONG_TEXT = " ".join(
    [
        "Hello there.",
        "This is the second sentence, a little longer than the first one.",
        "A third sentence follows it.",
        "And then a fourth, to be sure.",
        "The fifth one ends the text.",
    ]
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("speech-session-models")


@pytest.fixture(scope="module")
def gateway(log_dir: Path, models: Path) -> Iterator[Gateway]:
    with hosted(log_dir, models, "w-speech", "--session-slots", "2") as (servicer, _):
        yield servicer


def say(peer: Peer, text: str, voice: str = "") -> None:
    peer.outbox.put(
        pb.WorkerSessionResponse(
            input=realtime_pb2.SessionRequest(text=realtime_pb2.TextInput(text=text, voice=voice))
        )
    )


def spoken(gateway: Gateway, texts: list[str], config: dict[str, Any]) -> list[pb.WorkerSessionRequest]:
    """Every message of a speech session fed `texts` and then `end`."""
    peer = gateway.offer(model=SPEECH, image=b"", config=config)
    ready = peer.ready()
    assert (ready.chunk_samples, ready.sample_rate, ready.frames_per_chunk) == (SPEECH_CHUNK, RATE, 0)
    for text in texts:
        say(peer, text)
    peer.end()
    return peer.rest()


def audio_of(messages: list[pb.WorkerSessionRequest]) -> bytes:
    return b"".join(c.audio for c in chunks(messages))


def test_a_speech_session_streams_the_text_as_audio_chunks_sentence_by_sentence(gateway: Gateway) -> None:
    messages = spoken(gateway, ["Hello there. How are you today?"], {"seed": 5})
    assert last(messages).closed.reason == "ended", last(messages)
    out = chunks(messages)
    assert len(out) >= 2 and [c.sequence for c in out] == list(range(1, len(out) + 1))
    assert [c.pts_ms for c in out] == [500.0 * i for i in range(len(out))]
    for chunk in out:
        assert not chunk.frames and not chunk.segment
        assert (len(chunk.audio), chunk.sample_rate, chunk.duration_ms) == (2 * SPEECH_CHUNK, RATE, 500.0)
    pcm = np.frombuffer(audio_of(messages), "<i2")
    assert np.abs(pcm).max() > 1000, "speech, not silence"
    report = last(messages).closed.report
    assert report.chunks_out == len(out) and report.first_chunk_latency_ms > 0

    # The same seed gives the same speech; the first sentence alone is its beginning (each
    # sentence is synthesized on its own, the first with the session's seed).
    assert audio_of(spoken(gateway, ["Hello there. How are you today?"], {"seed": 5})) == audio_of(messages)
    first = np.frombuffer(audio_of(spoken(gateway, ["Hello there."], {"seed": 5})), "<i2")
    alone = np.trim_zeros(first, "b")
    assert len(alone) > 0 and np.array_equal(pcm[: len(alone)], alone)
    assert audio_of(spoken(gateway, ["Hello there. How are you today?"], {"seed": 6})) != audio_of(messages)


def test_the_first_audio_leaves_before_the_whole_text_is_made(gateway: Gateway) -> None:
    peer = gateway.offer(model=SPEECH, image=b"", config={"seed": 1, "speed": 0.5})
    ready = peer.ready()
    say(peer, LONG_TEXT)
    peer.end()
    messages = peer.rest()
    assert last(messages).closed.reason == "ended", last(messages)
    total = len(chunks(messages)) * SPEECH_CHUNK
    buffered = [m.progress.buffered_samples for m in messages if m.WhichOneof("message") == "progress"]
    # The speech goes into the buffer as it is made, never more than max_buffered_samples at a
    # time: with several times that much speech in all, the first chunks left while the rest of
    # the text was still to be spoken.
    assert total > 3 * ready.max_buffered_samples
    assert max(buffered) <= ready.max_buffered_samples


def test_interrupt_drops_the_speech_not_yet_sent(gateway: Gateway) -> None:
    # Thirty sentences take seconds to synthesize: the interrupt, sent once the first chunk is
    # back, comes long before the last of them.
    text = " ".join(f"Sentence number {i} of a long answer." for i in range(30))
    whole = len(chunks(spoken(gateway, [text], {"seed": 2})))
    peer = gateway.offer(model=SPEECH, image=b"", config={"seed": 2})
    peer.ready()
    say(peer, text)
    first = peer.read()
    assert first is not None and first.chunk.sequence == 1, first
    peer.interrupt()
    say(peer, "Yes.")
    peer.end()
    messages = peer.rest()
    assert last(messages).closed.reason == "ended", last(messages)
    out = chunks(messages)
    assert [c.sequence for c in out] == list(range(2, len(out) + 2)), "numbered on after the first"
    assert len(out) + 1 < whole / 2


@pytest.mark.parametrize(
    ("model", "config", "feed", "code", "field"),
    [
        (SPEECH, {}, lambda p: say(p, "Hello.", voice="alloy"), "INVALID_ARGUMENT", "text.voice"),
        (SPEECH, {}, lambda p: say(p, "x" * 4097), "INVALID_ARGUMENT", "text.text"),
        (SPEECH, {}, lambda p: say(p, "... !!! 123"), "INVALID_ARGUMENT", "text.text"),
        (SPEECH, {}, lambda p: say(p, ""), "INVALID_ARGUMENT", "text.text"),
        (SPEECH, {}, lambda p: p.audio(speech(1, 800)), "FAILED_PRECONDITION", "audio"),
        (SPEECH, {"speed": 5}, None, "INVALID_ARGUMENT", "config.speed"),
        (SPEECH, {"steps": 2}, None, "INVALID_ARGUMENT", "config.steps"),
        (HEAD_TTS, {}, lambda p: say(p, "Hi.", voice="nova"), "INVALID_ARGUMENT", "text.voice"),
        (HEAD_TTS, {"speed": "fast"}, None, "INVALID_ARGUMENT", "config.speed"),
    ],
    ids=[
        "unknown-voice",
        "text-too-long",
        "nothing-speakable",
        "empty-text",
        "audio-to-speech",
        "speed-out-of-range",
        "unknown-config",
        "head-unknown-voice",
        "head-speed-not-a-number",
    ],
)
def test_bad_text_or_settings_end_the_session_with_the_field(
    gateway: Gateway, model: models_pb2.ModelSpec, config: dict[str, Any], feed: Any, code: str, field: str
) -> None:
    peer = gateway.offer(model=model, image=b"" if model is SPEECH else None, config=config)
    if feed is not None:
        peer.ready()
        feed(peer)
    messages = peer.rest()
    error = last(messages)
    assert error.WhichOneof("message") == "error", error
    assert (error.error.code, error.error.field) == (code, field), error.error.message
    assert not chunks(messages)
    # The worker serves on.
    assert chunks(spoken(gateway, ["Fine."], {"seed": 3}))


def test_a_speech_session_names_its_one_voice(gateway: Gateway) -> None:
    for voice in ("", "default", "tiny-vits-stream"):
        peer = gateway.offer(model=SPEECH, image=b"", config={"seed": 4})
        peer.ready()
        say(peer, "Hello.", voice=voice)
        peer.end()
        assert last(peer.rest()).closed.reason == "ended", voice


def test_a_text_driven_talking_head_makes_frames_from_the_speech_and_takes_audio_too(
    gateway: Gateway,
) -> None:
    voice = np.frombuffer(audio_of(spoken(gateway, ["Hello there."], {"seed": 9})), "<i2")
    voice = np.trim_zeros(voice, "b")
    peer = gateway.offer(model=HEAD_TTS, config={"seed": 9})
    ready = peer.ready()
    assert (ready.chunk_samples, ready.sample_rate, ready.frames_per_chunk) == (HEAD_CHUNK, RATE, FRAMES)
    say(peer, "Hello there.")
    sent = speech(1, HEAD_CHUNK // 2)
    peer.audio(sent)  # after the text: it follows the speech in the session's audio
    peer.end()
    messages = peer.rest()
    assert last(messages).closed.reason == "ended", last(messages)
    out = chunks(messages)
    assert out and all(len(c.frames) == FRAMES for c in out)
    audio = np.frombuffer(b"".join(c.audio for c in out), "<i2")
    assert np.array_equal(audio[: len(voice)], voice), "the chunks carry the speech they were made from"
    at = audio.tobytes().find(sent.tobytes(), 2 * len(voice))
    assert at >= 2 * len(voice), "then the audio sent after the text"
    assert len(audio) == HEAD_CHUNK * len(out)
