"""Plain data types of the public contract.

These mirror `proto/omnirt/v1` as dataclasses, so users (and the controller and worker
internals) never have to build or read a protobuf message. `omnirt._internal.convert` maps both ways.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from omnirt._internal.limits import DEFAULT_INPUT_MAX_BYTES
from omnirt._internal.modes import DEFAULT_MODE

SCHEMA_VERSION = "1.0.0"


class Task(enum.StrEnum):
    """What a request asks a model to produce from what."""

    TEXT2IMAGE = "text2image"
    IMAGE2IMAGE = "image2image"
    INPAINT = "inpaint"
    TEXT2VIDEO = "text2video"
    IMAGE2VIDEO = "image2video"
    AUDIO2VIDEO = "audio2video"
    TEXT2AUDIO = "text2audio"


class MediaRole(enum.StrEnum):
    """What a request input is for."""

    IMAGE = "image"
    MASK = "mask"
    AUDIO = "audio"
    VIDEO = "video"
    CONTROL_IMAGE = "control_image"


class MediaKind(enum.StrEnum):
    """The kind of an artifact."""

    IMAGE = "image"
    VIDEO = "video"
    AUDIO = "audio"


class JobState(enum.StrEnum):
    """The life cycle of a job."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """True for SUCCEEDED, FAILED and CANCELLED."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


@dataclass
class MediaInput:
    """One input file: inline bytes or a URI."""

    role: MediaRole
    data: bytes = b""
    uri: str = ""
    mime_type: str = ""

    @classmethod
    def from_file(cls, role: MediaRole | str, path: str | Path) -> MediaInput:
        """Read a local file as an inline input."""
        return cls(role=MediaRole(role), data=Path(path).read_bytes())


@dataclass
class Adapter:
    """A LoRA (or similar) adapter applied to one request."""

    name: str
    scale: float = 1.0


class WebhookEvent(enum.StrEnum):
    """A job event a webhook can ask for (delivered as type `job.<value>`)."""

    QUEUED = "queued"
    STARTED = "started"
    PROGRESS = "progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass
class Webhook:
    """Signed POSTs to `url` about a job's events (all of them when `events` is empty).

    `progress_interval_ms`: least time between two progress deliveries (0 = 1000 ms).
    """

    url: str
    events: list[WebhookEvent] = field(default_factory=list)
    progress_interval_ms: int = 0


@dataclass
class GenerateRequest:
    """One generation. Fields left as None take the model's or preset's defaults.

    `task` left as None means the model's first task (text2image for tiny-sd, text2video for tiny-wan).
    """

    model: str
    task: Task | None = None
    prompt: str = ""
    negative_prompt: str = ""
    inputs: list[MediaInput] = field(default_factory=list)
    width: int | None = None
    height: int | None = None
    num_frames: int | None = None
    fps: float | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    seed: int | None = None
    scheduler: str = ""
    num_outputs: int | None = None
    preset: str = ""
    adapters: list[Adapter] = field(default_factory=list)
    priority: int = 0
    deadline_ms: int = 0
    timeout_ms: int = 0
    idempotency_key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    output_format: str = ""
    inline_limit_bytes: int = 0
    quality: int = 0
    strength: float | None = None
    duration_ms: int | None = None
    webhook: Webhook | None = None


@dataclass
class Artifact:
    """One produced file; `data` holds its bytes when they travelled inline."""

    index: int
    kind: MediaKind
    mime_type: str
    data: bytes = b""
    uri: str = ""
    size_bytes: int = 0
    sha256: str = ""
    width: int = 0
    height: int = 0
    num_frames: int = 0
    fps: float = 0.0
    duration_ms: int = 0
    seed: int = 0
    file_name: str = ""
    # Audio: samples per second and channels (1 mono, 2 stereo); 0 for images and videos.
    sample_rate: int = 0
    channels: int = 0
    # Object store (controller --artifact-store s3://...): a presigned GET URL, valid until
    # `url_expires_at_ms`, and where the object lives; empty when the bytes went through the
    # controller. Client.download_artifact works in both cases.
    url: str = ""
    url_expires_at_ms: int = 0
    object_uri: str = ""

    def save(self, path: str | Path) -> Path:
        """Write the bytes to `path` (a folder gets `file_name` inside it) and return the path."""
        target = Path(path)
        if target.is_dir():
            target = target / (self.file_name or f"output-{self.index}")
        if not self.data and self.size_bytes:
            raise ValueError("artifact bytes are not inline; download them with Client.download_artifact")
        target.write_bytes(self.data)
        return target

    def verify(self) -> bool:
        """True when the inline bytes match the sha256 the worker computed."""
        return hashlib.sha256(self.data).hexdigest() == self.sha256


@dataclass
class StageTiming:
    """Wall time of one stage of a run."""

    name: str
    duration_ms: float
    start_offset_ms: float = 0.0


@dataclass
class RunReport:
    """How a result was made; `schema_version` follows semver."""

    schema_version: str = SCHEMA_VERSION
    run_id: str = ""
    job_id: str = ""
    worker_id: str = ""
    model: str = ""
    task: Task | None = None
    backend: str = ""
    execution_mode: str = ""
    device: str = ""
    dtype: str = ""
    queue_wait_ms: float = 0.0
    timings: list[StageTiming] = field(default_factory=list)
    execution_ms: float = 0.0
    peak_memory_bytes: int = 0
    config_resolved: dict[str, Any] = field(default_factory=dict)
    cold_start: bool = False
    attempt: int = 0
    batch_size: int = 0
    batch_group_id: str = ""
    seeds: list[int] = field(default_factory=list)
    cache_hits: dict[str, int] = field(default_factory=dict)
    trace_id: str = ""
    warnings: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    pipeline_class: str = ""
    omnirt_version: str = ""
    tenant: str = ""

    def timing(self, name: str) -> float | None:
        """Duration in ms of the stage `name`, or None when the run had no such stage."""
        return next((t.duration_ms for t in self.timings if t.name == name), None)


@dataclass
class GenerateResult:
    """The outcome of a successful generation."""

    job_id: str
    artifacts: list[Artifact] = field(default_factory=list)
    report: RunReport = field(default_factory=RunReport)

    def save(self, folder: str | Path) -> list[Path]:
        """Write every artifact into `folder` under its file name."""
        target = Path(folder)
        target.mkdir(parents=True, exist_ok=True)
        return [a.save(target / (a.file_name or f"output-{a.index}")) for a in self.artifacts]


@dataclass
class JobError:
    """Why a job did not succeed: a gRPC status code name and a message."""

    code: str
    message: str
    field: str = ""


@dataclass
class Progress:
    """Progress of a running job."""

    step: int = 0
    total_steps: int = 0
    stage: str = ""


@dataclass
class Job:
    """A submitted generation and where it stands."""

    id: str
    state: JobState
    model: str = ""
    task: Task | None = None
    priority: int = 0
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    worker_id: str = ""
    error: JobError | None = None
    result: GenerateResult | None = None
    progress: Progress | None = None
    idempotency_key: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    waiting_reason: str = ""
    deadline_ms: int = 0
    queue_position: int = 0
    tenant: str = ""
    webhook: Webhook | None = None


class EventKind(enum.StrEnum):
    """Which field of a JobEvent is set."""

    STATE = "state"
    PROGRESS = "progress"
    STAGE = "stage"
    PREVIEW = "preview"
    LOG = "log"
    RESULT = "result"


@dataclass
class JobEvent:
    """One item of a job's event stream; `kind` says which of the optional fields is set."""

    job_id: str
    kind: EventKind
    sequence: int = 0
    time: datetime | None = None
    state: JobState | None = None
    worker_id: str = ""
    error: JobError | None = None
    attempt: int = 0
    progress: Progress | None = None
    stage: str = ""
    stage_finished: bool = False
    stage_duration_ms: float = 0.0
    preview: bytes = b""
    preview_mime_type: str = ""
    log_stream: str = ""
    log_text: str = ""
    result: GenerateResult | None = None


@dataclass
class ModelDefaults:
    """Values used for request fields left unset."""

    width: int = 0
    height: int = 0
    num_frames: int = 0
    fps: float = 0.0
    num_inference_steps: int = 0
    guidance_scale: float = 0.0
    scheduler: str = ""
    strength: float = 0.0
    duration_ms: int = 0


@dataclass
class ModelLimits:
    """Bounds on what a request may ask of a model (0 = no bound)."""

    max_width: int = 0
    max_height: int = 0
    max_num_frames: int = 0
    max_inference_steps: int = 0
    max_num_outputs: int = 0
    max_batch_size: int = 0
    # Characters of `prompt` and of `negative_prompt` each: far above any text encoder's window
    # (CLIP reads 77 tokens, T5 512), what OpenAI's images API takes for gpt-image-1, and small
    # enough that a queue of them fits in memory.
    max_prompt_chars: int = 32_000
    # Bytes of inline `inputs[].data` together, held in the controller while the job is queued.
    max_input_bytes: int = DEFAULT_INPUT_MAX_BYTES
    # Milliseconds of a request's `duration_ms` (an audio model's longest clip).
    max_duration_ms: int = 0


@dataclass
class Preset:
    """A named set of request overrides."""

    name: str
    description: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class ModelSpec:
    """One catalog entry."""

    id: str
    family: str = ""
    tasks: list[Task] = field(default_factory=list)
    execution_mode: str = DEFAULT_MODE.value
    source: str = ""
    pipeline_class: str = ""
    aliases: list[str] = field(default_factory=list)
    defaults: ModelDefaults = field(default_factory=ModelDefaults)
    limits: ModelLimits = field(default_factory=ModelLimits)
    supports_batching: bool = False
    presets: list[Preset] = field(default_factory=list)
    description: str = ""
    runtime: dict[str, Any] = field(default_factory=dict)
    serving_workers: int = 0
    # Serves RealtimeService sessions (a resident streaming model), not whole jobs.
    streaming: bool = False
    # Worker id -> bytes the model takes there, for the connected workers that hold it loaded
    # (0 bytes: the worker's mode does not measure it).
    warm_on: dict[str, int] = field(default_factory=dict)


@dataclass
class ModelOutcome:
    """What one worker did with a `load_model` or `unload_model` (ModelService.LoadModel / UnloadModel)."""

    worker_id: str
    # The worker holds the model loaded after the call.
    loaded: bool = False
    # Why the worker did not do what was asked; None when it did.
    error: JobError | None = None
    load_ms: float = 0.0
    memory_bytes: int = 0
    # Nothing had to be done: warm already (load), not held (unload).
    unchanged: bool = False


class WorkerState(enum.StrEnum):
    """A connected worker's state."""

    READY = "ready"
    DRAINING = "draining"
    GONE = "gone"


@dataclass
class WorkerInfo:
    """A worker connected to the controller."""

    id: str
    state: WorkerState = WorkerState.READY
    execution_mode: str = ""
    backend: str = ""
    models: list[str] = field(default_factory=list)
    loaded_models: list[str] = field(default_factory=list)
    slots: int = 0
    busy_slots: int = 0
    hostname: str = ""
    pid: int = 0
    version: str = ""
    connected_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    running_job_ids: list[str] = field(default_factory=list)
    # Names in the worker's `--models` that the catalog lacks: it serves none of them.
    unknown_models: list[str] = field(default_factory=list)
    # Chosen once per worker process (a restarted worker has a new one).
    instance_id: str = ""
    # Its step engine: most rows per denoiser step (0: none), and the pipeline classes it batches.
    step_rows: int = 0
    step_pipelines: list[str] = field(default_factory=list)
    # Jobs this worker process finished since it started, as the worker counts them (they survive
    # a controller restart): succeeded, and failed (cancelled or refused jobs are neither).
    jobs_succeeded: int = 0
    jobs_failed: int = 0
    # The devices it runs on, as torch names them: "cpu", "cuda:0", "cuda:0,1".
    device: str = ""


@dataclass
class SessionInfo:
    """An open realtime session (ClusterService.ListSessions)."""

    session_id: str
    model: str = ""
    worker_id: str = ""
    controller: str = ""  # the controller relaying it
    tenant: str = ""
    opened_at: datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class ValidationResult:
    """What a valid request resolves to."""

    model: str
    task: Task
    execution_mode: str
    config_resolved: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
