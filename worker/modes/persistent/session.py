"""Realtime sessions on a resident process group (daemon side): `open_session`, `GroupSession`.

A session's state (reference latent, motion latents, noise generator) lives on the ranks of its
model's group (`streaming`), keyed by the session id; the daemon side keeps only the group, the
group's generation the session was opened on, and the geometry. Its ops go through the group's
request lock (`ResidentGroup.run`), so the pushes of several sessions of one group run one at a
time, between the group's jobs. A session holds its group (`ResidentGroup.hold`): it does not
idle out while a session is open. When the group dies or restarts the session's state is gone:
its push raises UNAVAILABLE (the group restarts as for jobs) and a new session works.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from omnirt.worker.modes.persistent.group import Aborted, Lease, ResidentGroup
from omnirt.worker.modes.persistent.launch import GroupError, LaunchSpec, launch_spec
from omnirt.worker.modes.persistent.settings import STREAMING_CLASSES
from omnirt.worker.realtime.api import ChunkOut, Geometry, OpenRequest, SessionRefused

if TYPE_CHECKING:
    from omnirt.worker.config import WorkerConfig

log = logging.getLogger(__name__)

INVALID_ARGUMENT = "INVALID_ARGUMENT"
CONFIG_KEYS = ("seed",)  # what `TalkingHeadPipeline.open` takes beside the portrait


class _Lost(Exception):
    """The group the session was opened on is gone (restarted, stopped or replaced)."""


def _seed(config: dict[str, Any]) -> int:
    """`config.seed` (Struct numbers arrive as floats: 7.0 is 7); a random one when absent."""
    for key in config:
        if key not in CONFIG_KEYS:
            raise SessionRefused(
                INVALID_ARGUMENT,
                f"config.{key}: a talking-head session takes only {', '.join(CONFIG_KEYS)}",
                f"config.{key}",
            )
    if "seed" not in config:
        return secrets.randbelow(2**63)
    value = config["seed"]
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value != int(value) or not 0 <= int(value) < 2**63:
        raise SessionRefused(
            INVALID_ARGUMENT, f"config.seed must be an integer in [0, 2**63), not {value!r}", "config.seed"
        )
    return int(value)


def _geometry(data: dict[str, Any]) -> Geometry:
    return Geometry(
        sample_rate=int(data["sample_rate"]),
        chunk_samples=int(data["chunk_samples"]),
        fps=float(data["fps"]),
        frames_per_chunk=int(data["frames_per_chunk"]),
        width=int(data["width"]),
        height=int(data["height"]),
    )


def _check_requested(request: OpenRequest, geometry: Geometry) -> None:
    """The client's size, rate and fps must be the model's (0 = the model's): it makes no other."""
    model = {
        "width": geometry.width,
        "height": geometry.height,
        "fps": geometry.fps,
        "sample_rate": geometry.sample_rate,
    }
    for name, wanted in (
        ("width", request.width),
        ("height", request.height),
        ("fps", request.fps),
        ("sample_rate", request.sample_rate),
    ):
        if wanted and wanted != model[name]:
            raise SessionRefused(
                INVALID_ARGUMENT,
                f"{name} {wanted:g} is not the model's {model[name]:g} (it streams {geometry.width}x"
                f"{geometry.height} at {geometry.fps:g} fps from {geometry.sample_rate} Hz audio; "
                "0 = the model's)",
                name,
            )


class Groups(Protocol):
    """What a session needs of the persistent executor: where groups start, and its groups."""

    config: WorkerConfig

    @property
    def backend(self) -> str:
        """The backend in use."""

    def group_for(self, spec: LaunchSpec) -> ResidentGroup:
        """The group of `spec.model_id`, created on first use."""


def open_session(executor: Groups, request: OpenRequest) -> GroupSession:
    """Open `request` on the resident group of its model (started first if need be)."""
    spec = request.model
    if spec.pipeline_class not in STREAMING_CLASSES:
        raise SessionRefused(
            "FAILED_PRECONDITION",
            f"model {spec.id!r} ({spec.pipeline_class or 'StableDiffusionPipeline'}) does not stream: "
            f"persistent_worker sessions run {', '.join(STREAMING_CLASSES)} models",
            "model",
        )
    try:
        launch, _ = launch_spec(spec, executor.backend, executor.config)
    except GroupError as exc:
        raise SessionRefused(exc.code, str(exc), "model") from exc
    if not request.reference_image:
        raise SessionRefused(
            INVALID_ARGUMENT,
            "a talking-head session needs a reference portrait (an image input)",
            "reference_image",
        )
    seed = _seed(request.config)
    group = executor.group_for(launch)
    group.hold()
    try:
        message = {
            "op": "session_open",
            "session_id": request.session_id,
            "reference_image": bytes(request.reference_image),
            "seed": seed,
        }
        lease, reply = group.run(message, lambda step, total, previews: False, lambda: None, lambda: None)
    except (GroupError, Aborted) as exc:
        group.release()
        code = exc.code if isinstance(exc, GroupError) else "UNAVAILABLE"
        raise SessionRefused(code, str(exc), "") from exc
    except BaseException:
        group.release()
        raise
    if reply.get("type") != "session_opened":
        group.release()
        raise _refusal(reply)
    session = GroupSession(group, lease, request.session_id, _geometry(reply["geometry"]))
    try:
        _check_requested(request, session.geometry)
    except SessionRefused:
        session.close()
        raise
    log.info("session %s opened on model %s (seed %d)", request.session_id, spec.id, seed)
    return session


def _refusal(reply: dict[str, Any]) -> SessionRefused:
    return SessionRefused(
        str(reply.get("code") or "INTERNAL"),
        str(reply.get("message", "the process group failed")),
        str(reply.get("field", "")),
    )


class GroupSession:
    """A `StreamingSession` whose state lives on the ranks of `group` (opened at `lease`'s start)."""

    def __init__(self, group: ResidentGroup, lease: Lease, session_id: str, geometry: Geometry) -> None:
        self.group = group
        self.generation = lease.record.generation
        self.session_id = session_id
        self.geometry = geometry
        self.last_reply: dict[str, Any] = {}  # the last chunk's reply (frames_per_rank, push_ms)
        self._lock = threading.Lock()
        self._open = True

    def _alive(self) -> bool:
        return self.group.ready and self.group.generation == self.generation

    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        def should_abort() -> str | None:
            return None if self._alive() else "lost"

        def on_dispatch(lease: Lease) -> None:
            if lease.record.generation != self.generation:  # a group restarted since the open
                raise _Lost

        try:
            _, reply = self.group.run(
                message, lambda step, total, previews: False, lambda: None, should_abort, on_dispatch
            )
        except (_Lost, Aborted) as exc:
            self._finish()
            raise SessionRefused(
                "UNAVAILABLE",
                f"a rank of the process group of model {self.group.spec.model_id!r} exited after session "
                f"{self.session_id!r} opened; the session's state went with it (the group is restarted): "
                "open a new session",
            ) from exc
        except GroupError as exc:
            self._finish()
            raise SessionRefused(
                "UNAVAILABLE",
                f"a rank of the process group of model {self.group.spec.model_id!r} exited during session "
                f"{self.session_id!r}; the session's state went with it (the group is restarted): open "
                f"a new session. {exc}",
            ) from exc
        return reply

    def push(self, pcm: np.ndarray) -> ChunkOut:
        """One chunk of `geometry.chunk_samples` int16 samples -> its frames, from the ranks."""
        with self._lock:
            if not self._open:
                raise SessionRefused(
                    "FAILED_PRECONDITION", f"session {self.session_id!r} is closed", "session"
                )
        reply = self._request({"op": "session_push", "session_id": self.session_id, "pcm": pcm})
        if reply.get("type") != "chunk":
            if reply.get("closed"):  # the ranks dropped it (a failure, not a bad chunk)
                self._finish()
            raise _refusal(reply)
        self.last_reply = {k: v for k, v in reply.items() if k not in ("frames", "audio")}
        return ChunkOut(frames=reply["frames"], audio=reply["audio"], pts_ms=float(reply["pts_ms"]))

    def close(self) -> None:
        """Drop the session's state on the ranks (the model stays resident). Idempotent."""
        with self._lock:
            was_open = self._open
        if not was_open:
            return
        if self._alive():
            try:
                self.group.run(
                    {"op": "session_close", "session_id": self.session_id},
                    lambda step, total, previews: False,
                    lambda: None,
                    lambda: None if self._alive() else "lost",
                    None,
                )
            except (GroupError, Aborted) as exc:  # the group went down: the state went with it
                log.info("session %s: close found the group gone (%s)", self.session_id, exc)
        self._finish()

    def _finish(self) -> None:
        """No longer open; the group's hold is released once."""
        with self._lock:
            was_open, self._open = self._open, False
        if was_open:
            self.group.release()
