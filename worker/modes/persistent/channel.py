"""The local channel between the worker daemon and rank 0 of a resident process group.

A Unix domain socket in a private (0700) temporary folder, created and listened on by the
daemon; rank 0 connects once after the model is loaded. Each message is one pickled Python
object (dicts of plain values and numpy arrays) preceded by its length as an 8-byte
big-endian unsigned integer. Pickle is safe here because both ends are this worker and its
own children, and only this user can reach the socket.

Messages, daemon -> rank 0: `{"op": "run", "job": {...}}` (one job, `cfg_denoise`),
`{"op": "run", "jobs": [{...}, ...]}` (a batch, `data_parallel`) or `{"op": "run", "call":
{"plans": [ItemPlan, ...], "parallel": KIND, "model": ModelSpec}}` (a batch, `pipeline_call`;
a plan's media inputs ride in its request as encoded bytes, bounded by `inputs.shipped`),
`{"op": "continue"}` / `{"op": "stop"}` (the answer to each progress message), `{"op": "shutdown"}`.
Rank 0 -> daemon: `{"type": "ready", ...}` or `{"type": "failed", "message": ...}` once at
start; per job `{"type": "progress", "step", "total", "previews"}` after every denoising step
(`previews`: `[(plan index, image bytes, mime type), ...]`, the pipeline program's live previews,
usually empty; rank 0 then waits for the answer and broadcasts it to the other ranks), and one of
`{"type": "result", "images": [...], ...}` (for a batch `images` holds one list per job; for
the pipeline program `outputs` holds one list per plan, None for a plan refused in `errors`),
`{"type": "stopped"}`,
`{"type": "error", "message": ..., "field": ...}`.

Session ops (the streaming program, `streaming`; `SESSION_OPS`), each answered by one message:
`{"op": "session_open", "session_id", "reference_image": bytes, "seed": int}` ->
`{"type": "session_opened", "geometry": {fps, sample_rate, chunk_samples, frames_per_chunk,
motion_frames, steps, height, width}}`; `{"op": "session_push", "session_id", "pcm": int16
array}` -> `{"type": "chunk", "frames": uint8 [n, H, W, 3], "audio": int16, "index", "pts_ms",
"frames_per_rank": [...], "push_ms"}`; `{"op": "session_close", "session_id"}` ->
`{"type": "session_closed", "known": bool}`. A refused op answers `{"type": "error", "code",
"message", "field"}` (a push's also says `"closed"`: whether the ranks dropped the session).
Several sessions may be open on one group; their ops go one at a time, like jobs.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!Q")
SESSION_OPS = ("session_open", "session_push", "session_close")


class ChannelClosed(Exception):
    """The other end closed the channel (or it broke)."""


def send(sock: socket.socket, message: Any) -> None:
    """Send one message; raises ChannelClosed when the peer is gone."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        sock.sendall(_HEADER.pack(len(data)) + data)
    except (BrokenPipeError, ConnectionError) as exc:
        raise ChannelClosed(str(exc)) from exc


def _read_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        try:
            chunk = sock.recv(min(left, 1 << 20))
        except ConnectionError as exc:
            raise ChannelClosed(str(exc)) from exc
        if not chunk:
            raise ChannelClosed("the peer closed the channel")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(sock: socket.socket) -> Any:
    """Receive one message; raises ChannelClosed at end of stream, TimeoutError after the socket's timeout."""
    (size,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    return pickle.loads(_read_exact(sock, size))
