"""`SessionStats`: how one realtime session keeps up, for its progress messages and its report.

Times are `time.monotonic()` seconds. A chunk's *due* time is when a player that started the
stream at the first chunk's arrival would need it: the first chunk's send time plus the chunk's
media time since the first chunk. A chunk sent after that is an underrun, but only when its input
was already there by then: output late because the client's audio came late is not the model
falling behind.
"""

from __future__ import annotations

import time

from omnirt._internal.protocol.realtime import SessionReport


class SessionStats:
    """Counts, latencies and the real-time clock of one session."""

    def __init__(self, worker_id: str, sample_rate: int) -> None:
        self.worker_id = worker_id
        self.sample_rate = sample_rate
        self.started = time.monotonic()
        self.chunks_in = 0
        self.chunks_out = 0
        self.samples_in = 0
        self.underruns = 0
        self.push_s = 0.0  # wall time spent in the model's pushes
        self.media_ms = 0.0  # output media time sent
        self.latencies_ms: list[float] = []
        self._first_input: float | None = None
        self._first_output: tuple[float, float] | None = None  # (send time, pts_ms)

    def audio_received(self, samples: int, at: float) -> None:
        """An AudioChunk of `samples` samples arrived at `at`."""
        self.chunks_in += 1
        self.samples_in += samples
        if self._first_input is None:
            self._first_input = at

    def speech_received(self, samples: int, at: float) -> None:
        """`samples` of speech, made from a text that arrived at `at`, went into the buffer."""
        self.samples_in += samples
        if self._first_input is None:
            self._first_input = at

    def pushed(self, seconds: float) -> None:
        """One push took `seconds` of wall time."""
        self.push_s += seconds

    def chunk_sent(
        self, pts_ms: float, duration_ms: float, ready_at: float, sent_at: float
    ) -> tuple[float, float]:
        """A chunk whose input was complete at `ready_at` left at `sent_at`: (latency_ms, lag_ms)."""
        if self._first_output is None:
            self._first_output = (sent_at, pts_ms)
        first_sent, first_pts = self._first_output
        due = first_sent + (pts_ms - first_pts) / 1000.0
        if sent_at > due and ready_at < due:
            self.underruns += 1
        self.chunks_out += 1
        self.media_ms += duration_ms
        latency_ms = max(0.0, (sent_at - ready_at) * 1000.0)
        self.latencies_ms.append(latency_ms)
        return latency_ms, max(0.0, (sent_at - due) * 1000.0)

    def report(self) -> SessionReport:
        """The session summed up, now."""
        first_latency = 0.0
        if self._first_input is not None and self._first_output is not None:
            first_latency = max(0.0, (self._first_output[0] - self._first_input) * 1000.0)
        mean = sum(self.latencies_ms) / len(self.latencies_ms) if self.latencies_ms else 0.0
        return SessionReport(
            chunks_in=self.chunks_in,
            chunks_out=self.chunks_out,
            first_chunk_latency_ms=first_latency,
            mean_chunk_latency_ms=mean,
            real_time_factor=self.media_ms / (self.push_s * 1000.0) if self.push_s > 0 else 0.0,
            underruns=self.underruns,
            duration_ms=(time.monotonic() - self.started) * 1000.0,
            worker_id=self.worker_id,
            audio_ms=self.samples_in * 1000.0 / self.sample_rate if self.sample_rate else 0.0,
        )
