"""The job directory of a subprocess-mode job: request and inputs in, artifacts out.

Layout (all under one fresh folder per job)::

    request.json        the request: prompt, sizes, steps, seed, fps, frames, extra, inputs
    inputs/image.png    each input as a file, named by role, extension sniffed from the bytes
    inputs/audio.wav
    outputs/            the command writes its artifacts here

Artifacts are collected from `outputs/` by extension (png, jpg/jpeg, webp images; mp4, gif
videos; wav audio), in name order, with sha256 and size; videos get frames, fps and size from
a sidecar `<name>.json` when the command writes one, else by probing the file with PyAV.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tempfile
import wave
from pathlib import Path
from typing import Any

from omnirt import types as t
from omnirt.worker.failures import JobFailure

INVALID_ARGUMENT = "INVALID_ARGUMENT"
INPUTS = "inputs"
OUTPUTS = "outputs"
REQUEST_FILE = "request.json"
MAX_SIDECAR_BYTES = 65536

# extension -> (kind, MIME type)
ARTIFACT_TYPES: dict[str, tuple[t.MediaKind, str]] = {
    "png": (t.MediaKind.IMAGE, "image/png"),
    "jpg": (t.MediaKind.IMAGE, "image/jpeg"),
    "jpeg": (t.MediaKind.IMAGE, "image/jpeg"),
    "webp": (t.MediaKind.IMAGE, "image/webp"),
    "mp4": (t.MediaKind.VIDEO, "video/mp4"),
    "gif": (t.MediaKind.VIDEO, "image/gif"),
    "wav": (t.MediaKind.AUDIO, "audio/wav"),
}
# sniffed format -> file extension of the input
INPUT_EXTENSIONS = {"jpeg": "jpg"}


def sniff_format(data: bytes) -> str:
    """The media format of `data` from its first bytes ("png", "wav", ...), or "" when unknown."""
    head = data[:16]
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "wav"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0):
        return "mp3"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"OggS"):
        return "ogg"
    if head[4:8] == b"ftyp":
        return "mp4"
    return ""


def create(root: Path, job_id: str) -> Path:
    """A fresh, empty job folder under `root` with `inputs/` and `outputs/`."""
    root.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in job_id)[:64] or "job"
    path = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=root))
    (path / INPUTS).mkdir()
    (path / OUTPUTS).mkdir()
    return path


def remove(path: Path) -> None:
    """Delete a job folder (what cannot be deleted is left, never raised)."""
    shutil.rmtree(path, ignore_errors=True)


def _input_bytes(media: t.MediaInput, name: str) -> bytes:
    # URIs are read before (media_inputs.with_uris_read, under the worker's input roots): this
    # module never opens a path a request names.
    if media.data:
        return media.data
    raise JobFailure(INVALID_ARGUMENT, f"{name}: the input has no data", name)


def write_inputs(job_dir: Path, request: t.GenerateRequest, formats: dict[str, list[str]]) -> dict[str, str]:
    """Write each input as `inputs/ROLE[-N].EXT`; return role (or role-N) -> absolute path.

    An input whose sniffed format is not among `formats[role]` (when the catalog lists some)
    is INVALID_ARGUMENT naming `inputs[i]`.
    """
    written: dict[str, str] = {}
    for index, media in enumerate(request.inputs):
        name = f"inputs[{index}]"
        data = _input_bytes(media, name)
        fmt = sniff_format(data)
        role = media.role.value if media.role else "input"
        accepted = formats.get(role)
        if accepted and fmt not in accepted:
            got = fmt or "data of an unknown format"
            raise JobFailure(
                INVALID_ARGUMENT,
                f"{name}: the {role} input must be {' or '.join(accepted)} (got {got})",
                name,
            )
        if accepted:  # the command was promised these formats: the bytes must really be one
            problem = undecodable(fmt, data)
            if problem:
                raise JobFailure(
                    INVALID_ARGUMENT, f"{name}: the {role} input does not decode as {fmt}: {problem}", name
                )
        key = role if role not in written else f"{role}-{sum(k.startswith(role) for k in written)}"
        ext = INPUT_EXTENSIONS.get(fmt, fmt) or "bin"
        path = job_dir / INPUTS / f"{key}.{ext}"
        path.write_bytes(data)
        written[key] = str(path)
    return written


IMAGE_FORMATS = frozenset({"png", "jpeg", "webp", "gif"})
AUDIO_FORMATS = frozenset({"mp3", "flac", "ogg"})


def undecodable(fmt: str, data: bytes) -> str:
    """Why `data`, sniffed as `fmt`, does not decode ("" when it does): a header followed by
    garbage, a truncated file, a WAV that is not PCM or holds no samples."""
    try:
        if fmt in IMAGE_FORMATS:
            from PIL import Image

            with Image.open(io.BytesIO(data)) as image:
                image.load()  # decodes every pixel: a truncated file fails here
            return ""
        if fmt == "wav":
            with wave.open(io.BytesIO(data)) as reader:
                frames = reader.getnframes()
                want = frames * reader.getsampwidth() * reader.getnchannels()
                if frames == 0:
                    return "it holds no samples"
                if len(reader.readframes(frames)) < want:
                    return f"it is truncated (its header says {frames} frames)"
            return ""
        if fmt in AUDIO_FORMATS:
            import av

            with av.open(io.BytesIO(data), mode="r") as container:
                if not container.streams.audio:
                    return "it has no audio stream"
                if not any(True for _ in container.decode(audio=0)):
                    return "it holds no audio frames"
            return ""
    except Exception as exc:  # every decoder's own error: the input's fault, said in its words
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    return ""


def request_document(
    job_id: str, spec: t.ModelSpec, request: t.GenerateRequest, inputs: dict[str, str], output_dir: Path
) -> dict[str, Any]:
    """What `request.json` holds: the resolved request, the input files and the output folder."""
    return {
        "job_id": job_id,
        "model": spec.id,
        "source": spec.source,
        "task": request.task.value if request.task else "",
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "width": request.width,
        "height": request.height,
        "num_frames": request.num_frames,
        "fps": request.fps,
        "duration_ms": request.duration_ms,
        "num_inference_steps": request.num_inference_steps,
        "guidance_scale": request.guidance_scale,
        "strength": request.strength,
        "scheduler": request.scheduler,
        "seed": request.seed,
        "num_outputs": request.num_outputs,
        "output_format": request.output_format,
        "quality": request.quality,
        "extra": request.extra,
        "inputs": inputs,
        "output_dir": str(output_dir),
    }


def write_request(job_dir: Path, document: dict[str, Any]) -> Path:
    """Write `request.json` and return its path."""
    path = job_dir / REQUEST_FILE
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str))
    return path


# ---- artifacts -----------------------------------------------------------------------------


def _sidecar(path: Path) -> dict[str, Any]:
    for candidate in (path.with_suffix(".json"), path.with_name(path.name + ".json")):
        if candidate.is_file() and candidate.stat().st_size <= MAX_SIDECAR_BYTES:
            try:
                data = json.loads(candidate.read_text())
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    return {}


def _probe_video(data: bytes) -> dict[str, Any]:
    """Width, height, frames, fps and duration of a video, read with PyAV (empty without it)."""
    try:
        import av
    except ImportError:
        return {}
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                return {}
            stream = container.streams.video[0]
            frames = int(stream.frames)
            if not frames:  # the container does not say: count the packets that hold a frame
                frames = len([p for p in container.demux(stream) if p.size])
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            duration_ms = int(container.duration / 1000) if container.duration else 0
            return {
                "width": stream.codec_context.width,
                "height": stream.codec_context.height,
                "num_frames": frames,
                "fps": fps,
                "duration_ms": duration_ms,
            }
    except Exception:  # a file PyAV cannot read is still returned, only without these facts
        return {}


def _image_size(data: bytes) -> tuple[int, int]:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except Exception:
        return 0, 0


def _wav_facts(data: bytes) -> tuple[int, int, int]:
    """(duration_ms, sample_rate, channels) of a PCM WAV; zeros for anything else."""
    try:
        with wave.open(io.BytesIO(data)) as reader:
            rate = reader.getframerate()
            return int(reader.getnframes() * 1000 / rate), rate, reader.getnchannels()
    except (wave.Error, EOFError, ZeroDivisionError):
        return 0, 0, 0


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def collect_artifacts(output_dir: Path, job_id: str, seed: int) -> list[t.Artifact]:
    """The artifacts the command wrote, in file name order, as inline Artifacts."""
    files = sorted(p for p in output_dir.rglob("*") if p.is_file() and p.suffix[1:].lower() in ARTIFACT_TYPES)
    artifacts = []
    for index, path in enumerate(files):
        ext = path.suffix[1:].lower()
        kind, mime = ARTIFACT_TYPES[ext]
        data = path.read_bytes()
        artifact = t.Artifact(
            index=index,
            kind=kind,
            mime_type=mime,
            data=data,
            size_bytes=len(data),
            sha256=hashlib.sha256(data).hexdigest(),
            seed=seed,
            file_name=f"{job_id}-{index}.{ext}",
        )
        if kind is t.MediaKind.IMAGE:
            artifact.width, artifact.height = _image_size(data)
        elif kind is t.MediaKind.VIDEO:
            facts = {**_probe_video(data), **_sidecar(path)}
            artifact.width, artifact.height = _int(facts.get("width")), _int(facts.get("height"))
            artifact.num_frames = _int(facts.get("num_frames"))
            fps = facts.get("fps")
            artifact.fps = float(fps) if isinstance(fps, int | float) else 0.0
            artifact.duration_ms = _int(facts.get("duration_ms"))
            if not artifact.duration_ms and artifact.fps and artifact.num_frames:
                artifact.duration_ms = int(artifact.num_frames * 1000 / artifact.fps)
        else:
            artifact.duration_ms, artifact.sample_rate, artifact.channels = _wav_facts(data)
        artifacts.append(artifact)
    return artifacts
