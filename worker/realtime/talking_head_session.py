"""Talking-head sessions in the worker's own process (the legacy_call mode).

`ResidentTalkingHeads` keeps each loaded `TalkingHeadPipeline` resident, one per (source,
device, dtype), shared by every session of that model: the weights load once, each session holds
only its own state (`talking_head.Session`). Loads of one model are serialized and run under the
model cache's `LOAD_LOCK` (building modules is not thread-safe). Resident talking heads are not
counted in `--model-cache-bytes` and are never evicted: a session may hold one at any time.

`TalkingHeadStream` is a session as `StreamingSession`; the model's errors become
`SessionRefused` naming the field.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from omnirt import types as t
from omnirt.worker.realtime.api import ChunkOut, Geometry, OpenRequest, SessionRefused
from omnirt.worker.redact import redact_paths
from omnirt.worker.runtime.backends import Placement
from omnirt.worker.tiny import registry as tiny_models

if TYPE_CHECKING:
    from omnirt.worker.pipelines.talking_head import Session, TalkingHeadPipeline

log = logging.getLogger(__name__)

STREAMING_CLASSES = ("TalkingHeadPipeline",)
# SessionOpen.config keys a talking head reads.
CONFIG_KEYS = ("seed",)


def is_streaming_class(pipeline_class: str) -> bool:
    """Whether catalog `pipeline_class` is a streaming model this process can host."""
    return pipeline_class in STREAMING_CLASSES


class TalkingHeadStream:
    """One talking-head session as a `StreamingSession` (push and close from one thread at a time)."""

    def __init__(self, session: Session, geometry: Geometry) -> None:
        self._session = session
        self.geometry = geometry

    def push(self, pcm: np.ndarray) -> ChunkOut:
        """The frames of one chunk of int16 PCM."""
        from omnirt.worker.pipelines.talking_head import InvalidAudioError, SessionClosedError

        try:
            chunk = self._session.push(pcm)
        except SessionClosedError as exc:
            raise SessionRefused("FAILED_PRECONDITION", str(exc), "session") from exc
        except InvalidAudioError as exc:
            raise SessionRefused("INVALID_ARGUMENT", str(exc), "audio.data") from exc
        return ChunkOut(frames=chunk.frames, audio=chunk.audio, pts_ms=float(chunk.pts_ms))

    def close(self) -> None:
        """Drop the session's latents (the pipeline stays resident)."""
        self._session.close()


def session_seed(config: dict[str, Any]) -> int:
    """The `seed` of SessionOpen.config (a random one when absent, as in the persistent_worker
    mode); SessionRefused for any other key."""
    for key in config:
        if key not in CONFIG_KEYS:
            known = ", ".join(CONFIG_KEYS)
            raise SessionRefused(
                "INVALID_ARGUMENT",
                f"config.{key}: unknown setting (a talking head reads: {known})",
                f"config.{key}",
            )
    if "seed" not in config:
        return secrets.randbelow(2**63)
    seed = config["seed"]
    # Struct numbers are floats: 7.0 is the seed 7; 7.5, "7" or true are not seeds.
    if (
        isinstance(seed, bool)
        or not isinstance(seed, int | float)
        or seed != int(seed)
        or not 0 <= seed < 2**63
    ):
        raise SessionRefused(
            "INVALID_ARGUMENT", f"config.seed: must be an integer in [0, 2**63), got {seed!r}", "config.seed"
        )
    return int(seed)


def reference_image(data: bytes | None) -> Any:
    """The decoded portrait (a PIL image); SessionRefused when it is missing or not an image."""
    from PIL import Image, UnidentifiedImageError

    if not data:
        raise SessionRefused(
            "INVALID_ARGUMENT",
            "inputs: a talking head needs a reference portrait (an inline MEDIA_ROLE_IMAGE input)",
            "inputs",
        )
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except UnidentifiedImageError as exc:
        raise SessionRefused(
            "INVALID_ARGUMENT",
            f"reference_image: {len(data)} bytes that are no image format PIL reads (PNG, JPEG, WebP, ...)",
            "reference_image",
        ) from exc
    except (OSError, ValueError) as exc:  # a known format, truncated or corrupt
        raise SessionRefused(
            "INVALID_ARGUMENT", f"reference_image: cannot be decoded: {exc}", "reference_image"
        ) from exc
    return image


class ResidentTalkingHeads:
    """Loaded talking-head pipelines, shared by the sessions of each model (thread-safe)."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir = model_dir
        self._lock = threading.Lock()
        self._pipelines: dict[tuple[str, str, str], TalkingHeadPipeline] = {}
        self._model_ids: set[str] = set()
        self._load_locks: dict[tuple[str, str, str], threading.Lock] = {}

    def loaded_models(self) -> list[str]:
        """Catalog ids of the resident talking heads."""
        with self._lock:
            return sorted(self._model_ids)

    def open(self, request: OpenRequest, placement: Placement) -> TalkingHeadStream:
        """A session of `request.model` animating its reference image; SessionRefused when not."""
        from omnirt.worker.pipelines.talking_head import InvalidReferenceError

        spec: t.ModelSpec = request.model
        if not is_streaming_class(spec.pipeline_class):
            raise SessionRefused(
                "FAILED_PRECONDITION",
                f"model {spec.id!r} (pipeline class {spec.pipeline_class or 'DiffusionPipeline'!r}) does not "
                f"stream; realtime sessions need one of: {', '.join(STREAMING_CLASSES)}",
                "model",
            )
        seed = session_seed(request.config)
        image = reference_image(request.reference_image)
        pipeline = self.pipeline(spec, placement)
        try:
            session = pipeline.open(image, seed)
        except InvalidReferenceError as exc:
            raise SessionRefused("INVALID_ARGUMENT", str(exc), exc.field) from exc
        g = pipeline.geometry
        geometry = Geometry(
            sample_rate=g.sample_rate,
            chunk_samples=g.chunk_samples,
            fps=float(g.fps),
            frames_per_chunk=g.frames_per_chunk,
            width=g.width,
            height=g.height,
        )
        return TalkingHeadStream(session, geometry)

    def pipeline(self, spec: t.ModelSpec, placement: Placement) -> TalkingHeadPipeline:
        """The resident pipeline of `spec` on `placement`, loaded on first use."""
        key = (spec.source or spec.id, placement.device, placement.dtype)
        with self._lock:
            found = self._pipelines.get(key)
            if found is not None:
                self._model_ids.add(spec.id)
                return found
            load_lock = self._load_locks.setdefault(key, threading.Lock())
        with load_lock:
            with self._lock:
                found = self._pipelines.get(key)
            if found is None:
                found = self._load(spec, placement)
                with self._lock:
                    self._pipelines[key] = found
            with self._lock:
                self._model_ids.add(spec.id)
            return found

    def _load(self, spec: t.ModelSpec, placement: Placement) -> TalkingHeadPipeline:
        from omnirt.worker.pipelines.loader import LOAD_LOCK
        from omnirt.worker.pipelines.talking_head import TalkingHeadPipeline

        source = spec.source or spec.id
        started = time.perf_counter()
        try:
            with LOAD_LOCK:
                folder = tiny_models.resolve_source(source, self.model_dir)
                if not os.path.isdir(folder):
                    raise ValueError(f"{source!r} is not a builtin:NAME or a local model folder")
                pipeline = TalkingHeadPipeline.from_pretrained(
                    folder, placement.device, placement.torch_dtype()
                )
        except Exception as exc:
            log.warning("loading talking head %s from %s failed: %s", spec.id, source, exc)
            reason = redact_paths(
                f"{type(exc).__name__}: {exc}", {self.model_dir: "MODEL_DIR"}, keep=[source]
            )
            raise SessionRefused(
                "FAILED_PRECONDITION", f"cannot load model {spec.id!r}: {reason}", "model"
            ) from exc
        log.info(
            "loaded talking head %s from %s in %.0f ms",
            spec.id,
            source,
            (time.perf_counter() - started) * 1000,
        )
        return pipeline
