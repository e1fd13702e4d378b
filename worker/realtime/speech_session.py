"""Speech in realtime sessions (the legacy_call mode): text in, speech out, sentence by sentence.

Two kinds of session take `text` (TextInput) this way:

- a **speech session**: a catalog entry of a transformers TTS model (`pipeline_class =
  "VitsModel"`) with `streaming = true` (`tiny-vits-stream`). It takes text only and streams the
  speech back as audio-only OutputChunks of `chunk_samples` = half a second at the model's rate
  (8,000 at 16 kHz: small enough that the first words leave soon, large enough that a chunk's
  message overhead stays small), no frames (`frames_per_chunk` 0).
- a **text-driven talking head**: a talking head whose catalog `runtime.speech_source` names a
  TTS model (`"builtin:tiny-vits"`, or a local folder). It takes audio and text; text is spoken
  by that model, resampled to the talking head's rate when the two differ, and fed into the
  session's audio buffer as if it had arrived as audio, so its chunks carry frames and speech.

`Voice.speak` checks the text and the voice at once (SessionRefused naming `text.text` or
`text.voice`) and returns an iterator that synthesizes one sentence per `next`, so the host
(`host.py`, in a thread) feeds the first sentence's audio into the buffer before the next one
is made. The speech model comes from the worker's model cache (shared with its `text2audio`
jobs of the same source) and is held in use while the session is open.

Seeds: `config.seed` (a random one when absent) seeds the session's first sentence, each next
sentence the seed plus its index in the session (over all its texts): the same seed and texts
give the same audio, but not the audio of one `text2audio` job of the whole text, which is one
forward pass. `config.speed` (0.25 to 4) is the job route's `extra.speed`.
"""

from __future__ import annotations

import dataclasses
import math
import re
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from omnirt import types as t
from omnirt.worker.realtime.api import ChunkOut, Geometry, OpenRequest, SessionRefused
from omnirt.worker.realtime.talking_head_session import (
    ResidentTalkingHeads,
    TalkingHeadStream,
    session_seed,
)
from omnirt.worker.runtime.backends import Placement
from omnirt.worker.tiny import registry as tiny_models

if TYPE_CHECKING:
    from omnirt.worker.pipelines.model_cache import CachedPipeline, ModelCache
    from omnirt.worker.pipelines.speech import SpeechPipeline

# The catalog `runtime` key of a talking head naming the TTS model that speaks its text.
SPEECH_SOURCE = "speech_source"
# The class the speech model of `speech_source` is loaded as.
SPEECH_CLASS = "VitsModel"
# As the job route's prompt (and OpenAI's speech input).
MAX_TEXT_CHARS = 4096
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# A sentence longer than this is cut at its last comma or space before it: VITS's time and
# memory grow with its input, and a long sentence would hold back the first audio.
MAX_SENTENCE_CHARS = 300
# Where a sentence ends: . ! ? ; followed by a space, a CJK full stop, exclamation or question
# mark or semicolon (no space follows those), or a line break.
SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|(?<=[\u3002\uff01\uff1f\uff1b])\s*|\s*\n\s*")
DEFAULT_VOICE = "default"
SPEECH_CONFIG = ("seed", "speed")


def speech_spec(spec: t.ModelSpec) -> t.ModelSpec | None:
    """The TTS model that speaks `spec`'s sessions: `spec` itself for a streaming speech model,
    the `runtime.speech_source` of a talking head, None for a session that takes no text."""
    if spec.pipeline_class == SPEECH_CLASS:
        return spec if spec.streaming else None
    source = spec.runtime.get(SPEECH_SOURCE)
    if source is None:
        return None
    if not isinstance(source, str) or not source:
        raise SessionRefused(
            "FAILED_PRECONDITION",
            f"model {spec.id!r}: runtime.{SPEECH_SOURCE} must be a model source "
            f"(builtin:NAME or a folder), not {source!r}",
            "model",
        )
    return t.ModelSpec(id=source, source=source, pipeline_class=SPEECH_CLASS, runtime={})


def voice_name(spec: t.ModelSpec) -> str:
    """The one voice of a speech model: its catalog id, or the builtin name of a `speech_source`."""
    return tiny_models.builtin_name(spec.source) or spec.id


def speech_config(config: dict[str, Any]) -> tuple[int, float | None]:
    """(seed, speed) of SessionOpen.config; SessionRefused naming `config.KEY`."""
    for key in config:
        if key not in SPEECH_CONFIG:
            raise SessionRefused(
                "INVALID_ARGUMENT",
                f"config.{key}: unknown setting (a speaking session reads: {', '.join(SPEECH_CONFIG)})",
                f"config.{key}",
            )
    seed = session_seed({k: v for k, v in config.items() if k == "seed"})
    speed = config.get("speed")
    if speed is None:
        return seed, None
    if (
        isinstance(speed, bool)
        or not isinstance(speed, int | float)
        or not math.isfinite(speed)
        or not MIN_SPEED <= speed <= MAX_SPEED
    ):
        raise SessionRefused(
            "INVALID_ARGUMENT",
            f"config.speed: a number from {MIN_SPEED:g} to {MAX_SPEED:g} (got {speed!r})",
            "config.speed",
        )
    return seed, float(speed)


def sentences(text: str) -> list[str]:
    """`text` cut into sentences (each at most MAX_SENTENCE_CHARS), blanks dropped."""
    out = []
    for sentence in SENTENCE_END.split(text):
        sentence = sentence.strip()
        while len(sentence) > MAX_SENTENCE_CHARS:
            head = sentence[:MAX_SENTENCE_CHARS]
            cut = max(head.rfind(", "), head.rfind(" "))
            cut = cut + 1 if cut > 0 else MAX_SENTENCE_CHARS
            out.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if sentence:
            out.append(sentence)
    return out


def resample(pcm: np.ndarray, rate: int, target: int) -> np.ndarray:
    """int16 `pcm` at `rate` as int16 at `target` (linear interpolation: speech for a talking
    head's features, not for a listener's ears)."""
    if rate == target or not len(pcm):
        return pcm
    count = max(1, round(len(pcm) * target / rate))
    positions = np.arange(count) * (rate / target)
    return np.round(np.interp(positions, np.arange(len(pcm)), pcm)).astype(np.int16)


class Voice:
    """A session's speaker: the speech model in use, its seed, speed and output rate."""

    def __init__(
        self,
        cache: ModelCache,
        cached: CachedPipeline,
        *,
        name: str,
        seed: int,
        speed: float | None,
        sample_rate: int,
    ) -> None:
        self._cache = cache
        self._cached: CachedPipeline | None = cached
        self.pipeline: SpeechPipeline = cached.pipeline
        self.name = name
        self.sample_rate = sample_rate
        self._seed, self._speed = seed, speed
        self._spoken = 0  # sentences synthesized in this session: the next one's seed offset
        self._lock = threading.Lock()

    def speak(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """int16 PCM of `text` at `sample_rate`, one sentence per item; SessionRefused at once
        for a voice the model has not or a text it cannot speak."""
        if voice not in ("", DEFAULT_VOICE, self.name):
            raise SessionRefused(
                "INVALID_ARGUMENT",
                f"text.voice: {voice!r} is not a voice of this model; it has one voice, "
                f"{self.name!r} (or leave it empty)",
                "text.voice",
            )
        if len(text) > MAX_TEXT_CHARS:
            raise SessionRefused(
                "INVALID_ARGUMENT",
                f"text.text: at most {MAX_TEXT_CHARS} characters (got {len(text)})",
                "text.text",
            )
        spoken = [s for s in sentences(text) if self.pipeline.text_ids(s)]
        if not spoken:
            raise SessionRefused(
                "INVALID_ARGUMENT",
                "text.text: holds no character this model's tokenizer reads (letters, for MMS-TTS)",
                "text.text",
            )
        return (self._say(sentence) for sentence in spoken)

    def _say(self, sentence: str) -> np.ndarray:
        import torch

        from omnirt.worker.pipelines.speech import SpeechOutput

        with self._lock:
            seed = (self._seed + self._spoken) % 2**63
            self._spoken += 1
        output: SpeechOutput = self.pipeline(
            sentence, generator=torch.Generator().manual_seed(seed), speed=self._speed
        )
        samples = np.nan_to_num(output.audios[0].float().cpu().numpy()[0], nan=0.0)
        pcm = np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
        return resample(pcm, self.pipeline.sampling_rate, self.sample_rate)

    def close(self) -> None:
        """The session is done with the speech model (it stays in the cache; idempotent)."""
        cached, self._cached = self._cached, None
        if cached is not None:
            self._cache.release(cached)


class SpeechStream:
    """A speech session as a `StreamingSession`: text in (`speak`), audio-only chunks out."""

    def __init__(self, voice: Voice) -> None:
        self._voice = voice
        rate = voice.sample_rate
        self.geometry = Geometry(
            sample_rate=rate,
            chunk_samples=rate // 2,
            fps=0.0,
            frames_per_chunk=0,
            width=0,
            height=0,
            takes_audio=False,
        )
        self._pushed = 0

    def speak(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """See `Voice.speak`."""
        return self._voice.speak(text, voice)

    def push(self, pcm: np.ndarray) -> ChunkOut:
        """One chunk of the speech: itself, timed, with no frames."""
        pts_ms = self._pushed * self.geometry.chunk_samples * 1000.0 / self.geometry.sample_rate
        self._pushed += 1
        return ChunkOut(frames=np.zeros((0, 0, 0, 3), np.uint8), audio=pcm, pts_ms=pts_ms)

    def close(self) -> None:
        """Release the speech model."""
        self._voice.close()


class SpokenTalkingHead:
    """A talking-head session that also speaks text (`speak`) into its own audio."""

    def __init__(self, head: TalkingHeadStream, voice: Voice) -> None:
        self._head = head
        self._voice = voice
        self.geometry = head.geometry

    def speak(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """See `Voice.speak` (at the talking head's rate)."""
        return self._voice.speak(text, voice)

    def push(self, pcm: np.ndarray) -> ChunkOut:
        """The frames of one chunk (spoken or sent as audio)."""
        return self._head.push(pcm)

    def close(self) -> None:
        """Close the talking head's session and release the speech model."""
        try:
            self._head.close()
        finally:
            self._voice.close()


class SpeakingSessions:
    """Opens the sessions that take text, on the worker's model cache."""

    def __init__(self, cache: ModelCache) -> None:
        self.cache = cache

    def open(
        self, request: OpenRequest, placement: Placement, heads: ResidentTalkingHeads
    ) -> SpeechStream | SpokenTalkingHead | None:
        """The session of `request` if its model takes text, else None (not ours to open)."""
        spec: t.ModelSpec = request.model
        speaker = speech_spec(spec)
        if speaker is None:
            return None
        seed, speed = speech_config(request.config)
        if speaker is spec:
            if request.reference_image:
                raise SessionRefused(
                    "INVALID_ARGUMENT", "inputs: a speech session takes no reference image", "inputs"
                )
            voice = self._voice(speaker, placement, name=spec.id, seed=seed, speed=speed, rate=0)
            return SpeechStream(voice)
        head = heads.open(dataclasses.replace(request, config={"seed": seed}), placement)
        try:
            voice = self._voice(
                speaker,
                placement,
                name=voice_name(speaker),
                seed=seed,
                speed=speed,
                rate=head.geometry.sample_rate,
            )
        except BaseException:
            head.close()
            raise
        return SpokenTalkingHead(head, voice)

    def _voice(
        self, spec: t.ModelSpec, placement: Placement, *, name: str, seed: int, speed: float | None, rate: int
    ) -> Voice:
        from omnirt.worker.pipelines.model_cache import ModelLoadError

        try:
            cached = self.cache.get(spec, placement)
        except ModelLoadError as exc:
            raise SessionRefused("FAILED_PRECONDITION", str(exc), "model") from exc
        rate = rate or cached.pipeline.sampling_rate
        return Voice(self.cache, cached, name=name, seed=seed, speed=speed, sample_rate=rate)
