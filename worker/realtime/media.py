"""A session's media: the one audio format it takes; its output frames as bytes, one JPEG per
frame or one fragmented-MP4 segment per chunk."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np
from PIL import Image

AUDIO_FORMAT = "pcm_s16le"  # signed 16-bit little-endian, mono: the input and the chunks' audio
JPEG = "jpeg"
FMP4 = "fmp4"
JPEG_QUALITY = 90


def video_encodings() -> list[str]:
    """The encodings this worker serves: "jpeg", and "fmp4" where PyAV (FFmpeg) is installed."""
    try:
        import av  # noqa: F401
    except ImportError:
        return [JPEG]
    return [JPEG, FMP4]


def jpeg_frames(frames: np.ndarray, quality: int = JPEG_QUALITY) -> list[bytes]:
    """One baseline JPEG per frame of `frames` uint8 [n, H, W, 3]."""
    encoded = []
    for frame in frames:
        out = io.BytesIO()
        Image.fromarray(frame).save(out, format="JPEG", quality=quality)
        encoded.append(out.getvalue())
    return encoded


def fmp4_segment(frames: np.ndarray, fps: float) -> bytes:
    """`frames` uint8 [n, H, W, 3] as one self-contained fragmented MP4 (H.264, video only).

    Each chunk's segment has its own init (`empty_moov`) and starts on a key frame, so a player
    can start at any chunk; the chunk's audio travels beside it (OutputChunk.audio).
    """
    import av

    out = io.BytesIO()
    options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"}
    with av.open(out, mode="w", format="mp4", options=options) as container:
        rate = Fraction(fps).limit_denominator(1001)
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = frames.shape[2], frames.shape[1]
        stream.pix_fmt = "yuv420p"
        # zerolatency: no lookahead or B-frames, so the chunk's frames leave with it.
        stream.options = {"tune": "zerolatency", "preset": "veryfast"}
        for index, pixels in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), format="rgb24")
            frame.pts = index
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()
