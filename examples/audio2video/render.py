"""Talking-head demo for OmniRT's `subprocess` execution mode.

Run by `omnirt-worker --mode subprocess` for the catalog's `talking-head-demo` model: it reads
the job's `request.json` (path in OMNIRT_REQUEST), the reference image (the IMAGE input) and
the audio (the AUDIO input, a PCM WAV), measures the loudness of the audio in one window per
video frame (RMS at the request's fps, mapped from -50..0 dBFS to 0..1) and draws each frame
from the image: brighter and with a wider-open mouth the louder the audio. The result is an
MP4 (H.264, with the audio muxed as AAC) or a GIF (no audio), both written with PyAV into
OMNIRT_OUTPUT_DIR, plus a sidecar JSON with its frame count and rate.

Progress goes to stdout in the worker's line protocol: `OMNIRT_STAGE <name> start|end` and
`OMNIRT_PROGRESS <frame> <frames>`. Bad input ends the script with status 2 and one line on
stderr saying what is wrong.

Needs numpy, Pillow and PyAV (`av`), all in OmniRT's `[worker]` extra.
"""

from __future__ import annotations

import json
import math
import os
import sys
import wave
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageEnhance

DEFAULT_FPS = 25.0
MAX_SIDE = 1024
SILENCE_DB = -50.0


def fail(message: str) -> None:
    """End the job with a clear message (the worker puts the last log lines in the error)."""
    print(f"render.py: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def stage(name: str, what: str) -> None:
    print(f"OMNIRT_STAGE {name} {what}", flush=True)


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """Samples as float32 in [-1, 1], shape (channels, n), and the sample rate."""
    try:
        with wave.open(path) as reader:
            channels, width, rate = reader.getnchannels(), reader.getsampwidth(), reader.getframerate()
            raw = reader.readframes(reader.getnframes())
    except (wave.Error, EOFError) as exc:
        fail(f"the audio input is not a PCM WAV file ({exc})")
    if width == 1:
        data = (np.frombuffer(raw, np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        data = np.frombuffer(raw, "<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw, np.uint8).reshape(-1, 3).astype(np.int32)
        data = ((b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)) << 8 >> 8).astype(np.float32) / 8388608.0
    elif width == 4:
        data = np.frombuffer(raw, "<i4").astype(np.float32) / 2147483648.0
    else:
        fail(f"the audio input has {width}-byte samples; 1 to 4 are supported")
    if rate <= 0 or channels <= 0:
        fail("the audio input has no sample rate or no channels")
    return data.reshape(-1, channels).T.copy(), rate


def loudness(samples: np.ndarray, rate: int, fps: float, frames: int) -> np.ndarray:
    """Per video frame: RMS of its audio window, mapped from -50..0 dBFS to 0..1."""
    mono = samples.mean(axis=0)
    levels = np.zeros(frames, np.float32)
    for i in range(frames):
        start, end = int(i * rate / fps), int((i + 1) * rate / fps)
        window = mono[start:end]
        if window.size:
            rms = float(np.sqrt(np.mean(window.astype(np.float64) ** 2)))
            db = 20.0 * math.log10(rms) if rms > 0 else SILENCE_DB
            levels[i] = min(1.0, max(0.0, (db - SILENCE_DB) / -SILENCE_DB))
    return levels


def render(base: Image.Image, level: float) -> Image.Image:
    """One frame: the image brightened and a mouth opened in proportion to `level`."""
    frame = ImageEnhance.Brightness(base).enhance(1.0 + 0.5 * level)
    draw = ImageDraw.Draw(frame)
    w, h = frame.size
    cx, cy = w / 2, h * 0.72
    half_w = w * 0.16
    half_h = max(1.0, h * 0.12 * level)
    draw.ellipse((cx - half_w, cy - half_h, cx + half_w, cy + half_h), fill=(90, 10, 20), outline=(40, 0, 0))
    return frame


def frame_size(request: dict[str, Any], image: Image.Image) -> tuple[int, int]:
    w = int(request.get("width") or image.width)
    h = int(request.get("height") or image.height)
    scale = min(1.0, MAX_SIDE / max(w, h))
    # H.264 in yuv420p wants even sides.
    return max(2, int(w * scale) // 2 * 2), max(2, int(h * scale) // 2 * 2)


def write_mp4(
    path: Path, frames: Any, fps: float, size: tuple[int, int], samples: np.ndarray, rate: int
) -> None:
    import av

    with av.open(str(path), "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        video.width, video.height, video.pix_fmt = size[0], size[1], "yuv420p"
        video.options = {"preset": "veryfast", "crf": "20"}
        layout = "mono" if samples.shape[0] == 1 else "stereo"
        audio = container.add_stream("aac", rate=rate, layout=layout)
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        pcm = samples[:2] if samples.shape[0] > 2 else samples
        step = audio.codec_context.frame_size or 1024
        for at in range(0, pcm.shape[1], step):
            chunk = np.ascontiguousarray(pcm[:, at : at + step], dtype=np.float32)
            aframe = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=layout)
            aframe.sample_rate, aframe.pts, aframe.time_base = rate, at, Fraction(1, rate)
            for packet in audio.encode(aframe):
                container.mux(packet)
        for packet in audio.encode():
            container.mux(packet)


def write_gif(path: Path, frames: Any, fps: float, size: tuple[int, int]) -> None:
    # PyAV rather than Pillow: Pillow merges identical frames, and a GIF must keep one per frame.
    import av

    with av.open(str(path), "w", format="gif") as container:
        video = container.add_stream("gif", rate=Fraction(fps).limit_denominator(1001))
        video.width, video.height, video.pix_fmt = size[0], size[1], "rgb8"
        for frame in frames:
            for packet in video.encode(av.VideoFrame.from_image(frame)):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)


def main() -> None:
    request = json.loads(Path(os.environ["OMNIRT_REQUEST"]).read_text())
    output_dir = Path(os.environ["OMNIRT_OUTPUT_DIR"])
    inputs = request.get("inputs", {})
    if "image" not in inputs or "audio" not in inputs:
        fail("audio2video needs an image input and an audio input")
    fps = float(request.get("fps") or DEFAULT_FPS)
    fmt = (request.get("output_format") or "mp4").lower()
    if fmt not in ("mp4", "gif"):
        fail(f"output format {fmt!r} is not supported (mp4, gif)")

    stage("analyze", "start")
    try:
        with Image.open(inputs["image"]) as opened:
            image = opened.convert("RGB")
    except OSError as exc:
        fail(f"the image input cannot be read ({exc})")
    samples, rate = read_wav(inputs["audio"])
    seconds = samples.shape[1] / rate
    frames = int(request.get("num_frames") or max(1, math.ceil(seconds * fps)))
    levels = loudness(samples, rate, fps, frames)
    size = frame_size(request, image)
    base = image.resize(size, Image.Resampling.LANCZOS)
    stage("analyze", "end")
    print(f"audio {seconds:.2f} s at {rate} Hz, {frames} frames of {size[0]}x{size[1]} at {fps:g} fps")

    def frame_stream() -> Any:
        for i, level in enumerate(levels):
            yield render(base, float(level))
            print(f"OMNIRT_PROGRESS {i + 1} {frames}", flush=True)

    stage("render", "start")
    target = output_dir / f"talking-head.{fmt}"
    if fmt == "mp4":
        write_mp4(target, frame_stream(), fps, size, samples, rate)
    else:
        write_gif(target, frame_stream(), fps, size)
    stage("render", "end")
    sidecar = {"num_frames": frames, "fps": fps, "width": size[0], "height": size[1]}
    target.with_suffix(".json").write_text(json.dumps(sidecar))
    print(f"wrote {target.name}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    main()
