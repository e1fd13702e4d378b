"""Video export: pipeline frames -> MP4 (H.264, PyAV) or GIF (Pillow) bytes with sha256.

Both encoders are deterministic here: the same frames give the same bytes (x264 runs without
its non-deterministic mode and the MP4 gets no creation time; the GIF has no timestamps), so a
fixed seed gives a fixed sha256 on one machine and one PyAV/ffmpeg build.

x264's AVX-512 code is left out (`x264_asm`): on an AVX-512 CPU (AMD Zen 4 here) the x264 that
PyAV ships encoded the same 64x64 frames into different bytes in about 1 run in 4, even with one
thread; with its instruction sets capped at AVX2 every run gave the same bytes as the common
result (and the C code gives stable bytes too, so the difference is in the AVX-512 routines).
"""

from __future__ import annotations

import functools
import hashlib
import io
import platform
from fractions import Fraction
from typing import Any

from omnirt import types as t

# format -> (MIME type, file extension)
VIDEO_FORMATS = {"mp4": ("video/mp4", "mp4"), "gif": ("image/gif", "gif")}
DEFAULT_VIDEO_FORMAT = "mp4"
DEFAULT_FPS = 16.0
# x264 constant-quality setting: visually lossless for these small clips.
MP4_CRF = "18"
# CPU flags (/proc/cpuinfo) that make x264 pick its AVX-512 routines (it needs all of them).
X264_AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def video_format(name: str) -> str:
    """The normalized video format for `name` ("" = mp4); ValueError when unsupported."""
    fmt = (name or DEFAULT_VIDEO_FORMAT).lower()
    if fmt not in VIDEO_FORMATS:
        raise ValueError(f"unsupported video format {name!r}; supported: mp4, gif")
    return fmt


def frames_uint8(video: Any) -> Any:
    """A (frames, height, width, 3) uint8 array from a pipeline video (array in [0, 1] or PIL list)."""
    import numpy as np

    if isinstance(video, list | tuple):
        array = np.stack(
            [np.asarray(frame.convert("RGB") if hasattr(frame, "convert") else frame) for frame in video]
        )
    else:
        array = np.asarray(video)
    if array.dtype != np.uint8:
        array = (np.clip(array, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if array.ndim != 4 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"expected frames shaped (frames, height, width, channels), got {array.shape}")
    if array.shape[-1] == 1:
        array = np.repeat(array, 3, axis=-1)
    return np.ascontiguousarray(array[..., :3])


@functools.cache
def x264_asm() -> str:
    """x264's `asm` setting: "" (its own detection) unless the CPU has AVX-512, then "AVX2".

    x264's names are cumulative ("AVX2" = MMX2 .. SSE4.2, AVX, FMA3, LZCNT, BMI1/2, AVX2), and
    every CPU with AVX-512 has them all; "Cache64" keeps its cache-line tuning (64-byte lines).
    Only Linux on x86-64 is looked at (/proc/cpuinfo); elsewhere x264 detects as usual.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    except OSError:
        return ""
    return "AVX2,Cache64" if set(flags) >= X264_AVX512_FLAGS else ""


def encode_mp4(frames: Any, fps: float) -> bytes:
    """H.264 in MP4 (yuv420p; odd sizes are padded by one pixel, as 4:2:0 needs even sizes)."""
    import av
    import numpy as np

    count, height, width, _ = frames.shape
    pad_h, pad_w = height % 2, width % 2
    if pad_h or pad_w:
        frames = np.pad(frames, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height = width + pad_w, height + pad_h
        stream.pix_fmt = "yuv420p"
        options: dict[str, object] = {"crf": MP4_CRF, "preset": "medium"}
        if x264_asm():
            options["x264-params"] = f"asm={x264_asm()}"
        stream.options = options
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def encode_gif(frames: Any, fps: float) -> bytes:
    """An animated GIF that loops forever (frame time rounded to 10 ms, GIF's unit)."""
    from PIL import Image

    pictures = [Image.fromarray(frame) for frame in frames]
    buf = io.BytesIO()
    duration = max(10, round(1000.0 / fps / 10) * 10)
    pictures[0].save(buf, format="GIF", save_all=True, append_images=pictures[1:], duration=duration, loop=0)
    return buf.getvalue()


def encode_video(frames: Any, fmt: str, fps: float) -> bytes:
    """Encode uint8 frames (see `frames_uint8`) as `fmt` ("mp4" or "gif")."""
    return encode_mp4(frames, fps) if fmt == "mp4" else encode_gif(frames, fps)


def video_artifact(video: Any, *, index: int, seed: int, job_id: str, fmt: str, fps: float) -> t.Artifact:
    """An inline video Artifact with frames, fps, duration, size, sha256 and seed."""
    frames = frames_uint8(video)
    data = encode_video(frames, fmt, fps)
    count, height, width, _ = frames.shape
    mime, ext = VIDEO_FORMATS[fmt]
    return t.Artifact(
        index=index,
        kind=t.MediaKind.VIDEO,
        mime_type=mime,
        data=data,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        width=width,
        height=height,
        num_frames=count,
        fps=fps,
        duration_ms=round(count * 1000.0 / fps),
        seed=seed,
        file_name=f"{job_id}-{index}.{ext}",
    )
