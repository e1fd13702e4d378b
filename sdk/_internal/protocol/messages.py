"""The worker protocol's messages as plain dataclasses: the one set both daemons work on.

Each class is the proto message of the same name in `omnirt.worker.v1` (gateway.proto), with
the public messages inside it as `omnirt.types` dataclasses; `convert` turns them into stream
messages and back. The controller's core and engines and the worker's executors see only these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnirt import types as t

# Trailing metadata of the UNAVAILABLE that ends a worker's stream when its controller shuts
# down: the worker reconnects at once (to another controller behind the same address), quietly.
RECONNECT_KEY, RECONNECT_VALUE = "omnirt-reconnect", "controller-shutdown"

# ---- worker -> controller ----------------------------------------------------------------


@dataclass
class Hello:
    """A worker announces itself and what it can do (the first message of every stream)."""

    worker_id: str
    execution_mode: str
    backend: str
    slots: int
    # Catalog model ids this worker serves; empty means every model of its execution mode.
    models: list[str] = field(default_factory=list)
    loaded_models: list[str] = field(default_factory=list)
    hostname: str = ""
    pid: int = 0
    version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    token: str = ""
    # The worker reads batched controller messages.
    accepts_batches: bool = True
    # Chosen once per worker process: a Hello with a connected worker's id is let in only from it.
    instance_id: str = ""
    # Its heartbeats list what it holds (`Heartbeat.running`): the controller reconciles by them.
    reports_running: bool = True
    session_slots: int = 0
    # It answers LoadModel and UnloadModel (with ModelLoaded).
    loads_models: bool = True
    # Its step engine: most rows per denoiser step (0: none), and the pipeline classes it batches.
    step_rows: int = 0
    step_pipelines: list[str] = field(default_factory=list)
    # The devices it runs on, as torch names them ("cpu", "cuda:0", "cuda:0,1"); fixed for the process.
    device: str = ""


@dataclass
class Heartbeat:
    """Keeps the worker's lease, with what it holds now."""

    busy_slots: int = 0
    loaded_models: list[str] = field(default_factory=list)
    memory_bytes: int = 0
    # Draining: it finishes what it runs and takes nothing new.
    draining: bool = False
    # job id -> assignment id of every job the worker holds (running or waiting for a slot).
    running: dict[str, str] = field(default_factory=dict)
    # The realtime sessions it hosts.
    sessions: list[str] = field(default_factory=list)
    # model id -> bytes, of the loaded models whose memory the worker measures.
    model_bytes: dict[str, int] = field(default_factory=dict)
    # Jobs this process finished since it started (cancelled and refused ones are neither).
    jobs_succeeded: int = 0
    jobs_failed: int = 0


@dataclass
class AssignmentEvent:
    """Progress of one job of an assignment (the controller numbers events)."""

    assignment_id: str
    event: t.JobEvent


@dataclass
class ItemOutcome:
    """How one job of an assignment ended: exactly one of `result` and `error` is set."""

    job_id: str
    result: t.GenerateResult | None = None
    error: t.JobError | None = None


@dataclass
class AssignmentResult:
    """The end of one job of an assignment."""

    assignment_id: str
    outcome: ItemOutcome


@dataclass
class ModelLoaded:
    """The answer to a LoadModel or an UnloadModel."""

    request_id: str
    model_id: str
    # Done as asked: warm (load) or no longer held (unload); else `error` says why.
    ok: bool = True
    error: t.JobError | None = None
    load_ms: float = 0.0
    memory_bytes: int = 0
    # Nothing had to be done: warm already, or not held.
    unchanged: bool = False


WorkerMessage = Hello | Heartbeat | AssignmentEvent | AssignmentResult | ModelLoaded

# ---- controller -> worker ----------------------------------------------------------------


@dataclass
class Welcome:
    """The controller accepted the worker."""

    worker_id: str
    heartbeat_interval_ms: int
    lease_timeout_ms: int
    # The controller reads batched worker messages.
    accepts_batches: bool = False
    # What the controller found wrong with the Hello (e.g. a model its catalog lacks).
    warnings: list[str] = field(default_factory=list)
    # The controller's --artifact-store ("" = none): the worker uploads only to that same store.
    artifact_store: str = ""


@dataclass
class AssignmentItem:
    """One job of an assignment; `request` is resolved already (defaults, presets, seed)."""

    job_id: str
    request: t.GenerateRequest
    attempt: int = 1
    queue_wait_ms: float = 0.0
    # The controller's side only: `request` as its store encoded it once for the job (an
    # omnirt.v1.GenerateRequest's bytes), sent as they are instead of converting it again per
    # attempt. Empty on the worker, which reads `request`.
    encoded_request: bytes = b""


@dataclass
class Assignment:
    """One pipeline call given to a worker: one job, or a batch of compatible jobs."""

    assignment_id: str
    model: t.ModelSpec
    items: list[AssignmentItem] = field(default_factory=list)
    # Absolute deadline in Unix epoch milliseconds; 0 = none.
    deadline_ms: int = 0
    # W3C trace context (traceparent, tracestate).
    trace_context: dict[str, str] = field(default_factory=dict)
    batch_group_id: str = ""
    # It joins a batch the worker's step engine runs: rows of that batch, not a slot.
    joins_batch: bool = False

    @property
    def job_ids(self) -> list[str]:
        """The ids of the jobs, in item order."""
        return [item.job_id for item in self.items]


@dataclass
class CancelAssignment:
    """Stop a job at its next step; `reason` ("CANCELLED", "DEADLINE_EXCEEDED") is its error code."""

    assignment_id: str
    job_id: str
    reason: str = "CANCELLED"


@dataclass
class Drain:
    """Finish what runs, take nothing new, exit."""

    reason: str = ""


@dataclass
class SessionSettings:
    """A session's SessionOpen as plain values (0 / "" = the model's or the default)."""

    model: str = ""
    inputs: list[t.MediaInput] = field(default_factory=list)
    video_encoding: str = ""
    audio_format: str = ""
    sample_rate: int = 0
    fps: float = 0.0
    width: int = 0
    height: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    idle_timeout_ms: int = 0

    @property
    def reference_image(self) -> bytes | None:
        """The first reference image's inline bytes (None when there is none, or it came by URI)."""
        image = self._image()
        return image.data if image is not None and not image.uri else None

    @property
    def reference_uri(self) -> str:
        """The first reference image's URI, when it came by reference."""
        image = self._image()
        return image.uri if image is not None else ""

    def _image(self) -> t.MediaInput | None:
        return next((m for m in self.inputs if m.role == t.MediaRole.IMAGE), None)


@dataclass
class SessionOffer:
    """Host a realtime session: dial WorkerSession and attach.

    On the worker, `error` is set when the offer itself cannot be read (it attaches and answers it).
    """

    session_id: str
    model: t.ModelSpec
    settings: SessionSettings = field(default_factory=SessionSettings)
    trace_context: dict[str, str] = field(default_factory=dict)
    # Absolute end in Unix epoch milliseconds (the controller's maximum duration); 0 = none.
    deadline_ms: int = 0
    error: t.JobError | None = None


@dataclass
class LoadModel:
    """Make `model` warm (ModelService.LoadModel); answered with ModelLoaded."""

    request_id: str
    model: t.ModelSpec


@dataclass
class UnloadModel:
    """Free `model_id` once no job of it runs there, giving up at `deadline_ms` (epoch ms; 0 = none)."""

    request_id: str
    model_id: str
    deadline_ms: int = 0


ControllerMessage = Welcome | Assignment | CancelAssignment | Drain | SessionOffer | LoadModel | UnloadModel
