"""What of a realtime session this worker refuses: the offer's settings, the model's size and
rate against the ones asked for, and each audio message. Each check returns the JobError that
ends the session (INVALID_ARGUMENT or FAILED_PRECONDITION, naming the field), or None.

The relay (`host.py`) asks these before it opens the model and for every audio message; they
read nothing but their arguments.
"""

from __future__ import annotations

from omnirt import types as t
from omnirt._internal.protocol.messages import SessionSettings
from omnirt._internal.protocol.realtime import AudioChunk
from omnirt.worker.realtime import media
from omnirt.worker.realtime.api import Geometry

# The input a session holds, in chunks of the model (max_buffered_samples = this * chunk_samples);
# one AudioChunk may carry at most as much.
MAX_BUFFERED_CHUNKS = 4


def invalid(field: str, message: str) -> t.JobError:
    """INVALID_ARGUMENT naming `field`."""
    return t.JobError("INVALID_ARGUMENT", f"{field}: {message}", field)


def check_settings(settings: SessionSettings) -> t.JobError | None:
    """What of the SessionOpen this worker cannot serve, before the model is opened."""
    if settings.audio_format not in ("", media.AUDIO_FORMAT):
        return invalid(
            "audio_format", f"{settings.audio_format!r} is not served; send {media.AUDIO_FORMAT!r}"
        )
    served = media.video_encodings()
    if settings.video_encoding not in ("", *served):
        return invalid(
            "video_encoding",
            f"{settings.video_encoding!r} is not served; this worker serves {', '.join(served)}",
        )
    if settings.reference_uri:
        return invalid("inputs", "the reference image must come inline (bytes), not by URI")
    return None


def check_geometry(settings: SessionSettings, geometry: Geometry) -> t.JobError | None:
    """A requested size, rate or sample rate other than the model's (0 = the model's): the
    models served here cannot resize or resample."""
    asked = (
        ("width", settings.width, geometry.width),
        ("height", settings.height, geometry.height),
        ("fps", settings.fps, geometry.fps),
        ("sample_rate", settings.sample_rate, geometry.sample_rate),
    )
    for name, value, model in asked:
        if value and value != model:
            return invalid(name, f"{value:g} is not the model's {model:g} (leave it 0 for the model's)")
    return None


def check_audio(
    audio: AudioChunk, geometry: Geometry, *, model_id: str, expected: int, closed: bool
) -> t.JobError | None:
    """One audio message of a session of `model_id`: the model must take audio, the input must
    be open (`closed`: `end` was read), the sequence number the `expected` one (or 0), the data
    whole 16-bit samples and at most MAX_BUFFERED_CHUNKS chunks."""
    if not geometry.takes_audio:
        return t.JobError(
            "FAILED_PRECONDITION",
            f"audio: model {model_id!r} is driven by text (send `text`), not audio",
            "audio",
        )
    if closed:
        return t.JobError("FAILED_PRECONDITION", "audio after end: the input is closed", "audio")
    if audio.sequence and audio.sequence != expected:
        return invalid("audio.sequence", f"got {audio.sequence}, expected {expected} (or 0)")
    if len(audio.data) % 2:
        return invalid(
            "audio.data", f"{len(audio.data)} bytes is not whole 16-bit samples ({media.AUDIO_FORMAT})"
        )
    most = MAX_BUFFERED_CHUNKS * geometry.chunk_samples
    if len(audio.data) > 2 * most:
        return invalid(
            "audio.data",
            f"{len(audio.data) // 2} samples in one message; at most {most} "
            f"({MAX_BUFFERED_CHUNKS} chunks of {geometry.chunk_samples})",
        )
    return None
