"""The streaming rank program: realtime talking-head sessions on a resident process group.

Every rank loads the whole `TalkingHeadPipeline` and keeps one `Session` per open session id,
opened from the same portrait bytes and seed, so every rank holds the same reference latent,
motion latents and noise generator. A push runs on every rank in lockstep:

- **replicated** (every rank computes the same thing): the input checks, the wav2vec features,
  the noise draw and the denoising steps, so every rank ends the push with the same latents and
  carries the same motion latents into the next one (no collective is needed for them);
- **split**: the VAE decode of the chunk's new frames. Rank r decodes its contiguous share
  (`frame_range`: sizes differ by at most one, the lower ranks take the extra frames; 28 frames
  on 2 ranks: 14 + 14) and rank 0 gathers the shares (`gather_object`) into the chunk.

The split is the pipeline's own `decode` overridden (`SplitDecodePipeline`), so the rest of the
push is `talking_head.Session.push` unchanged: its checks, its state, its index and pts.

Each push ends with one agreement: every rank takes part in the one gather exactly once, with
its decoded share or with the error it raised (a rank that failed before the decode joins it
with the error), and rank 0 then broadcasts a verdict: OK, KEEP (a bad chunk, refused alike by
every rank before any state changed: the session stays) or DROP (any other failure: every rank
drops the session, so the ranks never disagree on its state). An error on one rank only thus
fails that push and that session, not the group. Opening agrees likewise (`all_gather_object`
of each rank's error).

Rank 0 returns the reply for the daemon (see `channel`); the other ranks return None.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from omnirt import types as t
from omnirt.worker.failures import JobFailure
from omnirt.worker.pipelines import media_inputs
from omnirt.worker.pipelines.talking_head import (
    SessionClosedError,
    TalkingHeadInputError,
    TalkingHeadPipeline,
)

# Rank 0's verdict on a push, broadcast to every rank.
OK, KEEP, DROP = 0, 1, 2


def load(source: str, device: str, dtype: str) -> TalkingHeadPipeline:
    """The talking-head pipeline of `source` on this rank's `device` (every rank holds it all)."""
    return TalkingHeadPipeline.from_pretrained(source, device, getattr(torch, dtype))


def frame_range(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, end) of the frames rank `rank` decodes: contiguous, sizes differ by at most one,
    the lower ranks take the extra ones."""
    base, extra = divmod(total, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class _Refused(Exception):
    """An op refused alike on every rank before any work (an unknown or duplicate session id)."""

    def __init__(self, code: str, message: str, field: str) -> None:
        super().__init__(message)
        self.code, self.field = code, field


class _PeerFailed(Exception):
    """Another rank's share of the decode failed (raised on rank 0 with that rank's error)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"])
        self.error = error


def _described(exc: BaseException, rank: int) -> dict[str, Any]:
    """An exception as the error the daemon gets; `keeps` when the session's state is untouched."""
    if isinstance(exc, _PeerFailed):
        return exc.error
    if isinstance(exc, _Refused):
        return {"code": exc.code, "message": str(exc), "field": exc.field, "keeps": True}
    if isinstance(exc, SessionClosedError):
        return {"code": "FAILED_PRECONDITION", "message": str(exc), "field": exc.field, "keeps": True}
    if isinstance(exc, TalkingHeadInputError):  # raised by the pipeline's checks, before any state change
        return {"code": "INVALID_ARGUMENT", "message": str(exc), "field": exc.field, "keeps": True}
    if isinstance(exc, JobFailure):
        return {
            **{"code": exc.error.code, "message": exc.error.message, "field": exc.error.field},
            "keeps": True,
        }
    traceback.print_exc()
    message = f"rank {rank}: {type(exc).__name__}: {' '.join(str(exc).split())[:500]}"
    return {"code": "INTERNAL", "message": message, "field": "", "keeps": False}


class _Gather:
    """The one gather of a push to rank 0; remembers whether this rank has joined it yet."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.joined = False
        self.parts: list[dict[str, Any]] = []

    def begin(self) -> None:
        self.joined, self.parts = False, []

    def join(self, part: dict[str, Any]) -> list[dict[str, Any]]:
        """Send `part` to rank 0; rank 0 gets every rank's part (the others an empty list)."""
        self.joined = True
        box: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(part, box, dst=0)
        self.parts = list(box) if box is not None else []
        return self.parts


class SplitDecodePipeline(TalkingHeadPipeline):
    """The loaded pipeline (the same modules) whose `decode` splits a chunk's frames across the
    ranks: each decodes its share, rank 0 gathers them; the other ranks return a placeholder
    (their chunk is dropped)."""

    def __init__(self, pipe: TalkingHeadPipeline, gather: _Gather) -> None:
        parts = {
            "audio_encoder": pipe.audio_encoder,
            "feature_extractor": pipe.feature_extractor,
            "denoiser": pipe.denoiser,
            "vae": pipe.vae,
            "scheduler": pipe.scheduler,
        }
        super().__init__(parts, pipe.geometry, pipe.device, pipe.dtype)
        self.gather = gather

    def decode(self, latents: Tensor) -> Tensor:
        total, (rank, world) = latents.shape[2], (self.gather.rank, self.gather.world_size)
        start, end = frame_range(total, rank, world)
        part: dict[str, Any] = {"frames": None, "error": None, "count": end - start}
        try:
            if end > start:
                # On the CPU for the gather (a pickled CUDA tensor would land on rank 0's device
                # of the same index); the dtype is kept, so rank 0 sees the very values decoded.
                part["frames"] = super().decode(latents[:, :, start:end]).cpu()
        except Exception as exc:
            part["error"] = _described(exc, rank)
        parts = self.gather.join(part)
        if part["error"] is not None:
            raise _PeerFailed(part["error"])
        if rank != 0:
            size = (total, 3, self.geometry.height, self.geometry.width)
            return torch.zeros(size, dtype=self.dtype, device=self.device)
        failed = next((p["error"] for p in parts if p["error"] is not None), None)
        if failed is not None:
            raise _PeerFailed(failed)
        return torch.cat([p["frames"] for p in parts if p["frames"] is not None]).to(self.device)


class StreamingProgram:
    """One rank's open sessions, by session id, and the session ops (`channel.SESSION_OPS`)."""

    def __init__(self, pipe: TalkingHeadPipeline, rank: int, world_size: int, device: str) -> None:
        self.rank, self.world_size, self.device = rank, world_size, device
        self.gather = _Gather(rank, world_size)
        self.pipe = SplitDecodePipeline(pipe, self.gather)
        self.sessions: dict[str, Any] = {}

    def handle(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """Run one session op on this rank; rank 0 returns the daemon's reply."""
        op = message["op"]
        if op == "session_open":
            return self.open(message)
        if op == "session_push":
            return self.push(message)
        return self.close(message)

    def open(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """`{"session_id", "reference_image": bytes, "seed"}` -> the geometry, or an error."""
        session_id = str(message["session_id"])
        error: dict[str, Any] | None = None
        session = None
        try:
            if session_id in self.sessions:
                raise _Refused("ALREADY_EXISTS", f"session {session_id!r} is already open", "session_id")
            media = t.MediaInput(role=t.MediaRole.IMAGE, data=message["reference_image"])
            image = media_inputs.decode_image(media, "reference_image")
            session = self.pipe.open(image, message["seed"])
        except Exception as exc:
            error = _described(exc, self.rank)
        errors: list[Any] = [None] * self.world_size
        dist.all_gather_object(errors, error)  # every rank opens it, or none does
        failed = next((e for e in errors if e is not None), None)
        if failed is None and session is not None:
            self.sessions[session_id] = session
        if self.rank != 0:
            return None
        if failed is not None:
            return {"type": "error", **failed}
        return {"type": "session_opened", "geometry": dataclasses.asdict(self.pipe.geometry)}

    def push(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """`{"session_id", "pcm"}` -> the chunk (frames, audio, index, pts_ms), or an error."""
        session_id = str(message["session_id"])
        started = time.perf_counter()
        self.gather.begin()
        error: dict[str, Any] | None = None
        chunk = None
        try:
            session = self.sessions.get(session_id)
            if session is None:
                raise _Refused("FAILED_PRECONDITION", f"no open session {session_id!r}", "session_id")
            chunk = session.push(message["pcm"])
        except Exception as exc:
            error = _described(exc, self.rank)
        if not self.gather.joined:  # failed before the decode: join its gather with the error
            self.gather.join({"frames": None, "error": error, "count": 0})
        verdict = OK
        if self.rank == 0:
            errors = [e for e in [error, *(p["error"] for p in self.gather.parts)] if e is not None]
            if errors:
                verdict = KEEP if all(e["keeps"] for e in errors) else DROP
        flag = torch.tensor([verdict], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, src=0)
        verdict = int(flag.item())
        if verdict == DROP:
            dropped = self.sessions.pop(session_id, None)
            if dropped is not None:
                dropped.close()
        if self.rank != 0:
            return None
        if verdict != OK:
            failed = error or next(p["error"] for p in self.gather.parts if p["error"] is not None)
            return {"type": "error", **failed, "closed": verdict == DROP}
        assert chunk is not None
        return {
            "type": "chunk",
            "frames": chunk.frames,
            "audio": chunk.audio,
            "index": chunk.index,
            "pts_ms": chunk.pts_ms,
            "frames_per_rank": [p["count"] for p in self.gather.parts],
            "push_ms": (time.perf_counter() - started) * 1000.0,
        }

    def close(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """`{"session_id"}` -> `session_closed` (idempotent: an unknown id is closed already)."""
        session = self.sessions.pop(str(message["session_id"]), None)
        if session is not None:
            session.close()
        return {"type": "session_closed", "known": session is not None} if self.rank == 0 else None
