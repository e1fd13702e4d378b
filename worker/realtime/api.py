"""What a worker's execution mode gives a realtime session: `StreamingSession`.

The daemon's relay (`host.py`) turns the controller's WorkerSession stream into calls on a
`StreamingSession` an executor opened (`Executor.open_session`), one chunk at a time, in a
thread: `push` blocks for the model's compute. `legacy_call` runs the model in this process;
`persistent_worker` runs it on its resident rank group (the streaming rank program).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np


class SessionRefused(Exception):
    """The session cannot open or go on: `code` (a gRPC status name), the field at fault."""

    def __init__(self, code: str, message: str, field: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Geometry:
    """The streaming contract of a session's model (`talking_head.json` for a talking head)."""

    sample_rate: int
    chunk_samples: int
    fps: float
    frames_per_chunk: int
    width: int
    height: int
    channels: int = 1
    takes_audio: bool = True  # False: the session is driven by text only (a speech session)


@dataclass
class OpenRequest:
    """A session as the controller offered it (SessionOffer), in plain values."""

    session_id: str
    model: Any  # omnirt.types.ModelSpec
    reference_image: bytes | None  # the encoded portrait (PNG/JPEG/WebP), when given
    config: dict[str, Any] = field(default_factory=dict)  # SessionOpen.config (seed, steps, ...)
    width: int = 0
    height: int = 0
    fps: float = 0.0
    sample_rate: int = 0
    deadline_ms: int = 0


@dataclass
class ChunkOut:
    """One pushed chunk's output: `frames` uint8 [n, H, W, 3], `audio` int16 PCM, `pts_ms`."""

    frames: np.ndarray
    audio: np.ndarray
    pts_ms: float


class StreamingSession(Protocol):
    """A resident model's open session; `push` and `close` are called from one thread at a time."""

    geometry: Geometry

    def push(self, pcm: np.ndarray) -> ChunkOut:
        """One chunk of exactly `geometry.chunk_samples` int16 samples -> its frames."""
        ...

    def close(self) -> None:
        """Release the session's state (the model stays resident)."""
        ...


@runtime_checkable
class SpeaksText(Protocol):
    """A `StreamingSession` that also takes text: the host feeds what `speak` yields into the
    session's audio buffer as if it had come as audio. A session without `speak` refuses text."""

    def speak(self, text: str, voice: str) -> Iterator[np.ndarray]:
        """int16 PCM at `geometry.sample_rate` of `text`, piece by piece (each `next` may compute:
        the host calls it in a thread); SessionRefused for a text or voice it cannot speak, at
        the call or at a `next`."""
        ...
