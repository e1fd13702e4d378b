"""Audio export: pipeline waveforms -> WAV (stdlib `wave`), raw PCM, or FLAC, MP3, Opus or AAC
(PyAV) bytes with sha256.

Every format is 16-bit: the waveform (floats in [-1, 1], clipped) is rounded to 16-bit PCM
first, so WAV, PCM and FLAC hold exactly the same samples and FLAC decodes back to the WAV's.
`pcm` is those samples alone, signed 16-bit little-endian, channels interleaved, no header (as
OpenAI's speech `pcm`; the artifact's `sample_rate` and `channels` say how to play it). MP3
(LAME), Opus (libopus in Ogg) and AAC (ffmpeg's encoder, in ADTS frames, as OpenAI's `aac`) are
lossy; they encode the same 16-bit samples. Opus takes 8, 12, 16, 24 or 48 kHz (a clip of
another rate is refused, not resampled) and always decodes at 48 kHz; AAC in ADTS has no field
for the encoder's delay, so a decoder plays 1024 samples of priming before the clip.

All are deterministic: the same samples give the same bytes. WAV and PCM have no metadata; the
others are written with ffmpeg's `bitexact` flag, which leaves out the encoder's version tag
("Lavf62.12.102") the muxers otherwise write, and gives Ogg the stream serial number 0 instead of
a random one, so the bytes do not change with the PyAV build's ffmpeg either (LAME's, libopus's
and the AAC encoder's own output still may, across their versions). AAC also takes the flag as
a codec option: its encoder writes its version ("Lavc62...") into every file otherwise.
"""

from __future__ import annotations

import hashlib
import io
import wave
from dataclasses import dataclass
from typing import Any

from omnirt import types as t

# format -> (MIME type, file extension)
AUDIO_FORMATS = {
    "wav": ("audio/wav", "wav"),
    "flac": ("audio/flac", "flac"),
    "mp3": ("audio/mpeg", "mp3"),
    "pcm": ("audio/pcm", "pcm"),
    "opus": ("audio/ogg", "opus"),
    "aac": ("audio/aac", "aac"),
}
DEFAULT_AUDIO_FORMAT = "wav"
# The sample rates MP3 has (MPEG-1, -2 and -2.5 layer III); LAME refuses any other.
MP3_SAMPLE_RATES = frozenset({8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000})
# The input rates Opus takes (libopus refuses any other); AAC's sampling frequency index.
OPUS_SAMPLE_RATES = frozenset({8000, 12000, 16000, 24000, 48000})
AAC_SAMPLE_RATES = frozenset(
    {7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000}
)
RATES = {"mp3": MP3_SAMPLE_RATES, "opus": OPUS_SAMPLE_RATES, "aac": AAC_SAMPLE_RATES}
# Channel counts -> ffmpeg layouts; the PyAV formats are written for mono and stereo only.
LAYOUTS = {1: "mono", 2: "stereo"}


@dataclass(frozen=True)
class Codec:
    """How PyAV writes one format: codec, the sample format it is given, container, codec options."""

    codec: str
    sample_format: str
    container: str
    options: tuple[tuple[str, str], ...] = ()


# FLAC and libopus take interleaved 16-bit samples, LAME planar ones; the AAC encoder takes
# planar floats, which PyAV converts the 16-bit samples to (exactly: every int16 is a float).
_CODECS = {
    "flac": Codec("flac", "s16", "flac"),
    "mp3": Codec("libmp3lame", "s16p", "mp3"),
    "opus": Codec("libopus", "s16", "ogg"),
    "aac": Codec("aac", "s16", "adts", (("flags", "+bitexact"),)),
}
_BITEXACT = {"fflags": "+bitexact"}


@dataclass(frozen=True)
class Waveform:
    """One generated clip: `samples` shaped (channels, samples), floats in [-1, 1]."""

    samples: Any
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def length(self) -> int:
        return int(self.samples.shape[-1])


def audio_format(name: str) -> str:
    """The normalized audio format for `name` ("" = wav); ValueError when unsupported."""
    fmt = (name or DEFAULT_AUDIO_FORMAT).lower()
    if fmt not in AUDIO_FORMATS:
        raise ValueError(f"unsupported audio format {name!r}; supported: {', '.join(AUDIO_FORMATS)}")
    return fmt


def format_problem(fmt: str, sample_rate: int, channels: int) -> str:
    """Why `fmt` cannot hold audio of `sample_rate` Hz and `channels` channels ("" when it can)."""
    if fmt in ("wav", "pcm"):
        return "" if channels >= 1 else f"no channels ({channels})"
    if channels not in LAYOUTS:
        return f"{fmt} is written for mono or stereo audio here; this model makes {channels} channels"
    rates = RATES.get(fmt)
    if rates is not None and sample_rate not in rates:
        listed = ", ".join(str(r) for r in sorted(rates))
        others = ", ".join(
            f for f in AUDIO_FORMATS if f != fmt and sample_rate in RATES.get(f, [sample_rate])
        )
        return f"{fmt} has no {sample_rate} Hz sample rate (it has {listed}); use {others}"
    codec = _CODECS.get(fmt)
    if codec is not None and not _has_encoder(codec.codec):
        return f"this worker's PyAV (ffmpeg) has no {codec.codec} encoder for {fmt}"
    return ""


def _has_encoder(name: str) -> bool:
    import av

    return name in av.codecs_available


def waveform(output: Any, sample_rate: int) -> Waveform:
    """A `Waveform` of one pipeline output: a (channels, samples) or (samples,) tensor or array."""
    import numpy as np

    if hasattr(output, "detach"):  # a torch tensor, maybe bfloat16 or on the GPU
        output = output.detach().float().cpu().numpy()
    samples = np.asarray(output, dtype=np.float32)
    if samples.ndim == 1:
        samples = samples[None, :]
    if samples.ndim != 2:
        raise ValueError(f"expected audio shaped (channels, samples), got {samples.shape}")
    return Waveform(samples, int(sample_rate))


def pcm16(clip: Waveform) -> Any:
    """The clip as 16-bit PCM, shaped (channels, samples); NaN becomes silence."""
    import numpy as np

    samples = np.nan_to_num(clip.samples, nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def encode_wav(pcm: Any, sample_rate: int) -> bytes:
    """A 16-bit PCM WAV (interleaved channels, little-endian as WAV is)."""
    channels = pcm.shape[0]
    buf = io.BytesIO()
    with wave.open(buf, "wb") as writer:
        writer.setnchannels(channels)
        writer.setsampwidth(2)
        writer.setframerate(sample_rate)
        writer.writeframes(pcm.T.astype("<i2").tobytes())
    return buf.getvalue()


def encode_pcm(pcm: Any) -> bytes:
    """Raw signed 16-bit little-endian samples, channels interleaved (no header)."""
    return bytes(pcm.T.astype("<i2").tobytes())


def encode_pyav(pcm: Any, sample_rate: int, fmt: str) -> bytes:
    """FLAC, MP3, Opus or AAC of 16-bit PCM through PyAV (its encoder cuts the one frame to its
    frame size, and converts the samples to the format the codec takes)."""
    import av
    import numpy as np

    codec = _CODECS[fmt]
    layout = LAYOUTS[pcm.shape[0]]
    # Packed formats take (1, samples x channels) interleaved; planar ones (channels, samples).
    planes = pcm if codec.sample_format.endswith("p") else pcm.T.reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(
        np.ascontiguousarray(planes), format=codec.sample_format, layout=layout
    )
    frame.sample_rate = sample_rate
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=codec.container, options=_BITEXACT) as container:
        stream = container.add_stream(
            codec.codec, rate=sample_rate, layout=layout, options=dict(codec.options)
        )
        assert isinstance(stream, av.AudioStream)  # an audio codec's stream (for the type checker)
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


def encode_audio(clip: Waveform, fmt: str) -> bytes:
    """Encode `clip` as `fmt` (one of `AUDIO_FORMATS`); ValueError when `fmt` cannot hold it."""
    problem = format_problem(fmt, clip.sample_rate, clip.channels)
    if problem:
        raise ValueError(problem)
    pcm = pcm16(clip)
    if fmt == "wav":
        return encode_wav(pcm, clip.sample_rate)
    return encode_pcm(pcm) if fmt == "pcm" else encode_pyav(pcm, clip.sample_rate, fmt)


def audio_artifact(clip: Waveform, *, index: int, seed: int, job_id: str, fmt: str) -> t.Artifact:
    """An inline audio Artifact with sample rate, channels, duration, sha256 and seed."""
    data = encode_audio(clip, fmt)
    mime, ext = AUDIO_FORMATS[fmt]
    return t.Artifact(
        index=index,
        kind=t.MediaKind.AUDIO,
        mime_type=mime,
        data=data,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        sample_rate=clip.sample_rate,
        channels=clip.channels,
        duration_ms=round(clip.length * 1000 / clip.sample_rate) if clip.sample_rate else 0,
        seed=seed,
        file_name=f"{job_id}-{index}.{ext}",
    )
