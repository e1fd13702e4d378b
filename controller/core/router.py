"""Connected workers: their capabilities, slots, leases, and the link that reaches them."""

from __future__ import annotations

import sys
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from omnirt._internal.protocol.messages import Assignment, ControllerMessage, Drain, Hello
from omnirt.controller.core.batching import may_join, step_key, step_rows
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import Plan
from omnirt.errors import AlreadyExists, OmniRTError, WorkerNotFound
from omnirt.types import ModelSpec, WorkerInfo, WorkerState

# The heartbeat count of a job whose assignment is not written yet: never judged.
_UNSENT = sys.maxsize


class WorkerLink(Protocol):
    """How the controller reaches one worker: the gRPC stream, or an in-process queue in unit tests."""

    def send(self, message: ControllerMessage) -> None:
        """Queue a message for the worker (never blocks)."""

    def close(self) -> None:
        """End the connection."""


@dataclass
class WorkerHandle:
    """A connected worker as the router sees it."""

    info: WorkerInfo
    link: WorkerLink
    # job id -> assignment id, for jobs the worker runs now (change it through start/release)
    running: dict[str, str] = field(default_factory=dict)
    last_seen: float = field(default_factory=time.monotonic)
    # What the Welcome tells the worker about its Hello (models the catalog lacks, ...).
    warnings: list[str] = field(default_factory=list)
    # The worker answers LoadModel / UnloadModel (its Hello said so), and the bytes of each
    # loaded model its last heartbeat measured.
    loads_models: bool = False
    model_bytes: dict[str, int] = field(default_factory=dict)
    # Heartbeats that listed jobs so far, and job id -> the one as of which the worker is known
    # to hold it (the last that listed it, or the first that may have left after its assignment
    # was written; _UNSENT while the assignment still waits to be written): see `unlisted`.
    _beats: int = 0
    _held_at: dict[str, int] = field(default_factory=dict)
    # assignment id -> jobs of it still running: one pipeline call takes one slot
    _calls: dict[str, int] = field(default_factory=dict)
    # model id -> jobs of it running here, and job id -> its model (for the busy batch window)
    _models: dict[str, int] = field(default_factory=dict)
    _job_models: dict[str, str] = field(default_factory=dict)
    # The rows its step engine runs: job id -> (step key, rows), step key -> rows; and the
    # assignments that joined a running batch (they take rows, not a slot).
    _job_steps: dict[str, tuple[Hashable, int]] = field(default_factory=dict)
    _step_rows: dict[Hashable, int] = field(default_factory=dict)
    _joined: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        attach = getattr(self.link, "attach", None)  # a link that says when it wrote an assignment
        if attach is not None:
            attach(self)

    def start(
        self,
        job_id: str,
        assignment_id: str,
        model: str,
        step: tuple[Hashable, int] | None = None,
        joined: bool = False,
    ) -> None:
        """Count a job sent here; `step` is its (step key, rows) when the worker's step engine
        may batch it; `joined`: it joined a running batch, and its assignment takes no slot."""
        self.running[job_id] = assignment_id
        self._calls[assignment_id] = self._calls.get(assignment_id, 0) + 1
        self._job_models[job_id] = model
        self._models[model] = self._models.get(model, 0) + 1
        self._held_at[job_id] = self._beats + 1  # as if sent now (see `in_transit`)
        if joined:
            self._joined.add(assignment_id)
        if step is not None and self.info.step_rows:
            self._job_steps[job_id] = step
            self._step_rows[step[0]] = self._step_rows.get(step[0], 0) + step[1]

    def release(self, job_id: str, assignment_id: str) -> bool:
        """Forget a finished job; True when it was running here under that assignment."""
        if self.running.get(job_id) != assignment_id:
            return False
        del self.running[job_id]
        self._held_at.pop(job_id, None)
        left = self._calls[assignment_id] - 1
        if left:
            self._calls[assignment_id] = left
        else:
            del self._calls[assignment_id]
            self._joined.discard(assignment_id)
        step = self._job_steps.pop(job_id, None)
        if step is not None:
            rows = self._step_rows.get(step[0], 0) - step[1]
            if rows > 0:
                self._step_rows[step[0]] = rows
            else:
                self._step_rows.pop(step[0], None)
        model = self._job_models.pop(job_id, "")
        left = self._models.get(model, 0) - 1
        if left > 0:
            self._models[model] = left
        else:
            self._models.pop(model, None)
        return True

    def running_of(self, model: str) -> int:
        """Jobs of `model` running on this worker now."""
        return self._models.get(model, 0)

    def running_by_model(self) -> dict[str, int]:
        """Model id -> jobs of it running on this worker now (a copy)."""
        return dict(self._models)

    def joins(self, spec: ModelSpec, key: Hashable, rows: int) -> bool:
        """Whether a job of `spec` with step key `key` and `rows` may join a batch running here."""
        if self.info.state is not WorkerState.READY or spec.pipeline_class not in self.info.step_pipelines:
            return False
        return may_join(self._step_rows.get(key, 0), rows, self.info.step_rows)

    def step_of(self, plan: Plan) -> tuple[Hashable, int] | None:
        """(step key, rows) of a job sent here that this worker's step engine batches, else None."""
        if not self.info.step_rows or plan.spec.pipeline_class not in self.info.step_pipelines:
            return None
        key = step_key(plan)
        return (key, step_rows(plan)) if key is not None else None

    def step_running(self, key: Hashable) -> int:
        """Rows of step key `key` running here."""
        return self._step_rows.get(key, 0)

    def step_batches(self) -> dict[Hashable, int]:
        """Step key -> rows, of the step batches running here (a copy)."""
        return dict(self._step_rows)

    @property
    def row_room(self) -> int:
        """Jobs (of two rows) that could still join this worker's running batches."""
        if self.info.state is not WorkerState.READY:
            return 0
        return sum(max(0, self.info.step_rows - rows) // 2 for rows in self._step_rows.values())

    def heartbeat(
        self, loaded_models: list[str], draining: bool, model_bytes: dict[str, int] | None = None
    ) -> None:
        """The worker is alive: its lease is renewed and its state refreshed."""
        self.last_seen = time.monotonic()
        self.info.last_heartbeat_at = datetime.now(UTC)
        self.info.loaded_models = loaded_models
        if model_bytes is not None:
            self.model_bytes = model_bytes
        if draining:
            self.info.state = WorkerState.DRAINING

    def drain(self, reason: str = "drained by an operator") -> None:
        """Take nothing new, finish what runs, exit (the worker's side of it)."""
        self.info.state = WorkerState.DRAINING
        self.link.send(Drain(reason))

    def in_transit(self, assignment: Assignment) -> None:
        """`assignment` waits to be written to the worker: its jobs are not judged until `sent`."""
        for item in assignment.items:
            if self.running.get(item.job_id) == assignment.assignment_id:
                self._held_at[item.job_id] = _UNSENT

    def sent(self, assignment: Assignment) -> None:
        """`assignment` was written to the worker: its jobs are judged as of now."""
        for item in assignment.items:
            if self.running.get(item.job_id) == assignment.assignment_id:
                self._held_at[item.job_id] = self._beats + 1

    def unlisted(self, listed: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """(job id, assignment id) of jobs counted here that the worker does not hold, given the
        (job id, assignment id) pairs a heartbeat lists.

        The first heartbeat after an assignment was written may have left before the worker read
        it; after that, a job is given up when two heartbeats in a row leave it out: a heartbeat
        the worker builds right after another one (a preload ended) or before it read what came
        in while its loop was busy may miss a job it has.
        """
        self._beats += 1
        gone = []
        for job_id, assignment_id in self.running.items():
            if (job_id, assignment_id) in listed:
                self._held_at[job_id] = self._beats
            elif self._beats - self._held_at.get(job_id, self._beats) >= 2:
                gone.append((job_id, assignment_id))
        return gone

    def take_over(self, old: WorkerHandle) -> None:
        """Hold the jobs of the same worker process's previous stream (they still run there), and
        send on this one what that one had not written yet."""
        for job_id, assignment_id in old.running.items():
            joined = assignment_id in old._joined
            self.start(
                job_id, assignment_id, old._job_models.get(job_id, ""), old._job_steps.get(job_id), joined
            )
        old.release_all()
        hand_over = getattr(old.link, "hand_over", None)  # what the old stream did not write
        if hand_over is not None:
            hand_over(self.link)

    def release_all(self) -> None:
        self.running.clear()
        self._calls.clear()
        self._models.clear()
        self._job_models.clear()
        self._held_at.clear()
        self._job_steps.clear()
        self._step_rows.clear()
        self._joined.clear()

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def busy_slots(self) -> int:
        """Assignments running now: a batch is one pipeline call, so it takes one slot (a job that
        joined a running step batch takes none)."""
        return len(self._calls) - len(self._joined) if self._joined else len(self._calls)

    @property
    def free_slots(self) -> int:
        if self.info.state is not WorkerState.READY:
            return 0
        return max(0, self.info.slots - self.busy_slots)

    def serves(self, spec: ModelSpec, backend: str = "") -> bool:
        """True when this worker's mode matches and it lists the model (or lists none), and it is of
        `backend` when one is asked for."""
        mode_ok = self.info.execution_mode == spec.execution_mode
        backend_ok = not backend or self.info.backend == backend
        return mode_ok and backend_ok and (not self.info.models or spec.id in self.info.models)

    def snapshot(self) -> WorkerInfo:
        self.info.busy_slots = self.busy_slots
        self.info.running_job_ids = sorted(self.running)
        return self.info


class WorkerRegistry:
    """Workers by id."""

    def __init__(self) -> None:
        self._workers: dict[str, WorkerHandle] = {}

    def add(self, handle: WorkerHandle, lease_s: float = 0.0) -> WorkerHandle | None:
        """Register a worker; returns the handle of the same id it replaces, if any.

        A connected worker heard from within `lease_s` keeps its id: a Hello with it from
        another process (another instance id) is refused with AlreadyExists. The same process
        (it lost its stream and the old one is not noticed as gone yet) replaces it at once.
        """
        self.check(handle.info, lease_s)
        old = self._workers.get(handle.id)
        self._workers[handle.id] = handle
        return old

    def check(self, info: WorkerInfo, lease_s: float) -> None:
        """AlreadyExists when a worker of another process, heard from within `lease_s`, holds `info.id`."""
        old = self._workers.get(info.id)
        if old is None or same_process(old.info, info):
            return
        if time.monotonic() - old.last_seen <= lease_s:
            raise id_taken(old.info)

    def remove(self, handle: WorkerHandle) -> bool:
        """Forget this handle (not a newer one with the same id); True when it was registered."""
        if self._workers.get(handle.id) is handle:
            del self._workers[handle.id]
            return True
        return False

    def release(self, handle: WorkerHandle, job_id: str, assignment_id: str) -> bool:
        """Forget a job that ended (`WorkerHandle.release`); a result that came up the stream of
        `handle` after a new stream of the same process took its jobs over frees the new one's slot."""
        if handle.release(job_id, assignment_id):
            return True
        current = self._workers.get(handle.id)
        return current is not None and current is not handle and current.release(job_id, assignment_id)

    def get(self, worker_id: str) -> WorkerHandle:
        handle = self._workers.get(worker_id)
        if handle is None:
            raise WorkerNotFound(f"worker {worker_id!r} is not connected", field="worker_id")
        return handle

    def all(self) -> list[WorkerHandle]:
        return sorted(self._workers.values(), key=lambda w: w.id)

    def free_slots(self) -> int:
        """Free slots over every worker (the dispatcher's budget; no sorting, it runs often)."""
        return sum(w.free_slots for w in self._workers.values())

    def candidates(self, spec: ModelSpec, backend: str = "") -> list[WorkerHandle]:
        """Workers that serve the model (on `backend`, when given), whether or not they have a free
        slot."""
        return [
            w for w in self._workers.values() if w.serves(spec, backend) and w.info.state is WorkerState.READY
        ]

    def pick(self, spec: ModelSpec, backend: str = "") -> WorkerHandle | None:
        """A worker with a free slot (of `backend`, when given): prefer one holding the model warm,
        then the least loaded."""
        free = [w for w in self.candidates(spec, backend) if w.free_slots > 0]
        if not free:
            return None
        return min(
            free,
            key=lambda w: (spec.id not in w.info.loaded_models, w.busy_slots / max(1, w.info.slots), w.id),
        )

    def join_room(self) -> int:
        """Jobs that could still join running step batches, over every worker (a budget)."""
        return sum(w.row_room for w in self._workers.values())

    def pick_join(self, spec: ModelSpec, key: Hashable, rows: int) -> WorkerHandle | None:
        """A worker running a step batch of `key` that a job of `rows` may join: the fullest one."""
        joinable = [w for w in self.candidates(spec) if w.joins(spec, key, rows)]
        if not joinable:
            return None
        return max(joinable, key=lambda w: (w.step_running(key), w.id))

    def running_of(self, model: str) -> int:
        """Jobs of `model` running on any worker now."""
        return sum(w.running_of(model) for w in self._workers.values())

    def running_by_model(self) -> dict[str, int]:
        """Model id -> jobs of it running on these workers now (the models running any)."""
        counts: dict[str, int] = {}
        for worker in self._workers.values():
            for model, n in worker.running_by_model().items():
                counts[model] = counts.get(model, 0) + n
        return counts

    def serving_count(self, spec: ModelSpec, backend: str = "") -> int:
        return len(self.candidates(spec, backend))

    def free_backends(self, spec: ModelSpec) -> set[str]:
        """The backends of the workers with a free slot for `spec`: the pinned queues it may take from."""
        return {w.info.backend for w in self.candidates(spec) if w.free_slots > 0}


def worker_info(hello: Hello) -> WorkerInfo:
    """A worker as its Hello announced it (READY)."""
    return WorkerInfo(
        id=hello.worker_id,
        state=WorkerState.READY,
        execution_mode=hello.execution_mode,
        backend=hello.backend,
        models=list(hello.models),
        loaded_models=list(hello.loaded_models),
        slots=hello.slots,
        hostname=hello.hostname,
        pid=hello.pid,
        version=hello.version,
        labels=dict(hello.labels),
        instance_id=hello.instance_id,
        step_rows=hello.step_rows,
        step_pipelines=list(hello.step_pipelines),
        device=hello.device,
    )


def id_taken(holder: WorkerInfo) -> AlreadyExists:
    """The refusal of a Hello with the id of `holder`, a live worker of another process."""
    return AlreadyExists(
        f"worker_id: worker {holder.id!r} is already connected (host {holder.hostname!r}, "
        f"pid {holder.pid}) and alive; a second process cannot take its id: give it "
        "another --worker-id, or stop the first",
        field="worker_id",
    )


def same_process(a: WorkerInfo, b: WorkerInfo) -> bool:
    """True when both come from one worker process (workers too old to send an instance id never are)."""
    return bool(a.instance_id) and a.instance_id == b.instance_id


def model_warnings(info: WorkerInfo, catalog: Catalog) -> list[str]:
    """What is wrong with the models a worker announces; sets `info.unknown_models`.

    Without a warning, a worker whose `--models` has a typo registers and serves nothing.
    """
    warnings = []
    info.unknown_models = []
    for name in info.models:
        try:
            spec = catalog.resolve(name)
        except OmniRTError as exc:
            info.unknown_models.append(name)
            warnings.append(
                f"--models names {name!r}, which the catalog lacks: no job of it comes here ({exc.message})"
            )
            continue
        if spec.id != name:
            warnings.append(
                f"--models names {name!r}, an alias: list the model id {spec.id!r}, "
                "or no job of it comes here"
            )
        elif spec.execution_mode and spec.execution_mode != info.execution_mode:
            warnings.append(
                f"model {name!r} runs in execution mode {spec.execution_mode!r}, not this worker's "
                f"{info.execution_mode!r}: no job of it comes here"
            )
    return warnings
