"""The executor interface: what every execution mode implements, and the stop checks it uses.

The daemon owns the connection and hands each `Assignment` to its executor, which returns
one `ItemOutcome` per job and reports progress through an event sink. Executors work on
plain dataclasses (`omnirt.types`, `omnirt._internal.protocol.messages`), never on protobuf messages.
The registry that picks a mode's executor is `omnirt.worker.modes.base`; it imports the modes,
and the modes import this module, never the registry.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from omnirt import types as t
from omnirt._internal.modes import ExecutionMode
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.worker.failures import CANCELLED, DEADLINE_EXCEEDED
from omnirt.worker.realtime.api import OpenRequest, SessionRefused, StreamingSession

if TYPE_CHECKING:
    from omnirt.worker.config import WorkerConfig

EventSink = Callable[[t.JobEvent], None]
"""Receives a job's events; executors call it on the event loop's thread."""


class CancelFlags:
    """Stop requests by job id: set on the event loop, read by pipeline threads at every step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reasons: dict[str, str] = {}

    def request(self, job_id: str, reason: str = CANCELLED) -> None:
        """Ask `job_id` to stop with `reason` (a JobError code); the first reason wins."""
        with self._lock:
            self._reasons.setdefault(job_id, reason or CANCELLED)

    def reason(self, job_id: str) -> str | None:
        """Why `job_id` must stop, or None."""
        with self._lock:
            return self._reasons.get(job_id)

    def clear(self, job_id: str) -> None:
        """Forget `job_id` (once its result is out)."""
        with self._lock:
            self._reasons.pop(job_id, None)


class StopCheck:
    """Answers "must this job stop now?" from its cancel flag and its absolute deadline."""

    def __init__(self, flags: CancelFlags, assignment: Assignment) -> None:
        self._flags = flags
        self._deadlines = {item.job_id: job_deadline_ms(assignment, item) for item in assignment.items}

    def reason(self, job_id: str) -> str | None:
        """CANCELLED / DEADLINE_EXCEEDED (or another code set by the daemon), or None."""
        flagged = self._flags.reason(job_id)
        if flagged:
            return flagged
        deadline = self._deadlines.get(job_id, 0)
        if deadline and time.time() * 1000.0 >= deadline:
            return DEADLINE_EXCEEDED
        return None

    def all_stopped(self, job_ids: list[str]) -> bool:
        """True when every job of `job_ids` must stop (then the call is aborted)."""
        return all(self.reason(job_id) for job_id in job_ids)


def job_deadline_ms(assignment: Assignment, item: AssignmentItem) -> int:
    """The earliest non-zero of the assignment's and the request's deadline (epoch ms; 0 = none)."""
    candidates = [d for d in (assignment.deadline_ms, item.request.deadline_ms) if d > 0]
    return min(candidates) if candidates else 0


class Executor(ABC):
    """Runs assignments of one execution mode."""

    # The mode it runs (a class attribute of each mode's executor; `FamilyRouter` takes its mode's).
    mode: ExecutionMode

    @property
    @abstractmethod
    def backend(self) -> str:
        """The backend really in use ("cpu", "cuda", "ascend"), known after `start()`."""

    async def start(self) -> None:
        """Get ready before the worker announces itself (imports, device checks)."""
        return None

    @abstractmethod
    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """Run `assignment`; return one outcome per item. Must not raise for a job's failure."""

    def loaded_models(self) -> list[str]:
        """Catalog ids of the models held warm (for Hello and Heartbeat)."""
        return []

    async def preload(self, spec: t.ModelSpec) -> None:
        """Make `spec` warm before its first job (`--preload`); NotImplementedError in modes without it."""
        raise NotImplementedError(f"the {self.mode} mode does not preload; models load on their first job")

    def model_memory(self) -> dict[str, int]:
        """Bytes each loaded model takes, for the models this mode measures (Heartbeat)."""
        return {}

    def step_engine(self) -> tuple[int, list[str]]:
        """The step engine's rows per step and the pipeline classes it batches ((0, []): none)."""
        return 0, []

    async def unload(self, model_id: str) -> bool:
        """Free `model_id` now; True when it was held, False when it was not.

        ModelInUse while a run or session uses it (the daemon waits for the model's jobs first);
        NotImplementedError in modes that cannot free a model on request.
        """
        raise NotImplementedError(f"the {self.mode} mode does not unload models on request")

    def open_session(self, request: OpenRequest) -> StreamingSession:
        """Open a realtime session of `request.model`, or raise SessionRefused.

        Called in a thread (it may load the model). Modes without streaming models refuse.
        """
        raise SessionRefused(
            "FAILED_PRECONDITION", f"the {self.mode} mode hosts no realtime sessions", "model"
        )

    async def close(self) -> None:
        """Release what the executor holds."""
        return None


class FamilyExecutor(Executor):
    """Runs the models of one family inside a worker of another mode (the null family's, `null`).

    Such a family needs no mode of its own: the registry (`base`) puts its executor in front of
    the executors of the modes that serve it, and `serves` says which models are the family's.
    """

    def __init__(self, config: WorkerConfig, host: Executor) -> None:
        self.config = config
        self.host = host  # the mode's executor: its backend is the one reports name

    @property
    def backend(self) -> str:
        """The host mode's backend: what the family's reports name."""
        return self.host.backend

    # The family's catalog name, and the source of its offline model: a model of either is the
    # family's (the registry asks this for every assignment of a worker hosting it).
    family: ClassVar[str]
    source: ClassVar[str] = ""

    @classmethod
    def serves(cls, spec: t.ModelSpec) -> bool:
        """Whether `spec` is a model of this family."""
        return spec.family == cls.family or (bool(cls.source) and spec.source == cls.source)
