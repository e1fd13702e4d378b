import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Task(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_UNSPECIFIED: _ClassVar[Task]
    TASK_TEXT2IMAGE: _ClassVar[Task]
    TASK_IMAGE2IMAGE: _ClassVar[Task]
    TASK_INPAINT: _ClassVar[Task]
    TASK_TEXT2VIDEO: _ClassVar[Task]
    TASK_IMAGE2VIDEO: _ClassVar[Task]
    TASK_AUDIO2VIDEO: _ClassVar[Task]
    TASK_TEXT2AUDIO: _ClassVar[Task]

class MediaRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEDIA_ROLE_UNSPECIFIED: _ClassVar[MediaRole]
    MEDIA_ROLE_IMAGE: _ClassVar[MediaRole]
    MEDIA_ROLE_MASK: _ClassVar[MediaRole]
    MEDIA_ROLE_AUDIO: _ClassVar[MediaRole]
    MEDIA_ROLE_VIDEO: _ClassVar[MediaRole]
    MEDIA_ROLE_CONTROL_IMAGE: _ClassVar[MediaRole]

class MediaKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEDIA_KIND_UNSPECIFIED: _ClassVar[MediaKind]
    MEDIA_KIND_IMAGE: _ClassVar[MediaKind]
    MEDIA_KIND_VIDEO: _ClassVar[MediaKind]
    MEDIA_KIND_AUDIO: _ClassVar[MediaKind]

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_QUEUED: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class WebhookEvent(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEBHOOK_EVENT_UNSPECIFIED: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_QUEUED: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_STARTED: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_PROGRESS: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_COMPLETED: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_FAILED: _ClassVar[WebhookEvent]
    WEBHOOK_EVENT_CANCELLED: _ClassVar[WebhookEvent]
TASK_UNSPECIFIED: Task
TASK_TEXT2IMAGE: Task
TASK_IMAGE2IMAGE: Task
TASK_INPAINT: Task
TASK_TEXT2VIDEO: Task
TASK_IMAGE2VIDEO: Task
TASK_AUDIO2VIDEO: Task
TASK_TEXT2AUDIO: Task
MEDIA_ROLE_UNSPECIFIED: MediaRole
MEDIA_ROLE_IMAGE: MediaRole
MEDIA_ROLE_MASK: MediaRole
MEDIA_ROLE_AUDIO: MediaRole
MEDIA_ROLE_VIDEO: MediaRole
MEDIA_ROLE_CONTROL_IMAGE: MediaRole
MEDIA_KIND_UNSPECIFIED: MediaKind
MEDIA_KIND_IMAGE: MediaKind
MEDIA_KIND_VIDEO: MediaKind
MEDIA_KIND_AUDIO: MediaKind
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_QUEUED: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
WEBHOOK_EVENT_UNSPECIFIED: WebhookEvent
WEBHOOK_EVENT_QUEUED: WebhookEvent
WEBHOOK_EVENT_STARTED: WebhookEvent
WEBHOOK_EVENT_PROGRESS: WebhookEvent
WEBHOOK_EVENT_COMPLETED: WebhookEvent
WEBHOOK_EVENT_FAILED: WebhookEvent
WEBHOOK_EVENT_CANCELLED: WebhookEvent

class MediaInput(_message.Message):
    __slots__ = ("role", "data", "uri", "mime_type")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    role: MediaRole
    data: bytes
    uri: str
    mime_type: str
    def __init__(self, role: _Optional[_Union[MediaRole, str]] = ..., data: _Optional[bytes] = ..., uri: _Optional[str] = ..., mime_type: _Optional[str] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "scale")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    name: str
    scale: float
    def __init__(self, name: _Optional[str] = ..., scale: _Optional[float] = ...) -> None: ...

class OutputOptions(_message.Message):
    __slots__ = ("format", "inline_limit_bytes", "quality")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    INLINE_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUALITY_FIELD_NUMBER: _ClassVar[int]
    format: str
    inline_limit_bytes: int
    quality: int
    def __init__(self, format: _Optional[str] = ..., inline_limit_bytes: _Optional[int] = ..., quality: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("task", "model", "prompt", "negative_prompt", "inputs", "width", "height", "num_frames", "fps", "num_inference_steps", "guidance_scale", "seed", "scheduler", "num_outputs", "preset", "adapters", "priority", "deadline_ms", "timeout_ms", "idempotency_key", "labels", "extra", "output", "strength", "duration_ms", "webhook")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    NEGATIVE_PROMPT_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    NUM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    PRESET_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    task: Task
    model: str
    prompt: str
    negative_prompt: str
    inputs: _containers.RepeatedCompositeFieldContainer[MediaInput]
    width: int
    height: int
    num_frames: int
    fps: float
    num_inference_steps: int
    guidance_scale: float
    seed: int
    scheduler: str
    num_outputs: int
    preset: str
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    priority: int
    deadline_ms: int
    timeout_ms: int
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    extra: _struct_pb2.Struct
    output: OutputOptions
    strength: float
    duration_ms: int
    webhook: Webhook
    def __init__(self, task: _Optional[_Union[Task, str]] = ..., model: _Optional[str] = ..., prompt: _Optional[str] = ..., negative_prompt: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[MediaInput, _Mapping]]] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., seed: _Optional[int] = ..., scheduler: _Optional[str] = ..., num_outputs: _Optional[int] = ..., preset: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ..., priority: _Optional[int] = ..., deadline_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., extra: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., output: _Optional[_Union[OutputOptions, _Mapping]] = ..., strength: _Optional[float] = ..., duration_ms: _Optional[int] = ..., webhook: _Optional[_Union[Webhook, _Mapping]] = ...) -> None: ...

class Webhook(_message.Message):
    __slots__ = ("url", "events", "progress_interval_ms")
    URL_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    url: str
    events: _containers.RepeatedScalarFieldContainer[WebhookEvent]
    progress_interval_ms: int
    def __init__(self, url: _Optional[str] = ..., events: _Optional[_Iterable[_Union[WebhookEvent, str]]] = ..., progress_interval_ms: _Optional[int] = ...) -> None: ...

class Artifact(_message.Message):
    __slots__ = ("index", "kind", "mime_type", "data", "uri", "size_bytes", "sha256", "width", "height", "num_frames", "fps", "duration_ms", "seed", "file_name", "sample_rate", "channels", "url", "url_expires_at_ms", "object_uri")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    URL_EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    OBJECT_URI_FIELD_NUMBER: _ClassVar[int]
    index: int
    kind: MediaKind
    mime_type: str
    data: bytes
    uri: str
    size_bytes: int
    sha256: str
    width: int
    height: int
    num_frames: int
    fps: float
    duration_ms: int
    seed: int
    file_name: str
    sample_rate: int
    channels: int
    url: str
    url_expires_at_ms: int
    object_uri: str
    def __init__(self, index: _Optional[int] = ..., kind: _Optional[_Union[MediaKind, str]] = ..., mime_type: _Optional[str] = ..., data: _Optional[bytes] = ..., uri: _Optional[str] = ..., size_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ..., duration_ms: _Optional[int] = ..., seed: _Optional[int] = ..., file_name: _Optional[str] = ..., sample_rate: _Optional[int] = ..., channels: _Optional[int] = ..., url: _Optional[str] = ..., url_expires_at_ms: _Optional[int] = ..., object_uri: _Optional[str] = ...) -> None: ...

class StageTiming(_message.Message):
    __slots__ = ("name", "duration_ms", "start_offset_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    duration_ms: float
    start_offset_ms: float
    def __init__(self, name: _Optional[str] = ..., duration_ms: _Optional[float] = ..., start_offset_ms: _Optional[float] = ...) -> None: ...

class RunReport(_message.Message):
    __slots__ = ("schema_version", "run_id", "job_id", "worker_id", "model", "task", "backend", "execution_mode", "device", "dtype", "queue_wait_ms", "timings", "execution_ms", "peak_memory_bytes", "config_resolved", "cold_start", "attempt", "batch_size", "batch_group_id", "seeds", "cache_hits", "trace_id", "warnings", "started_at", "finished_at", "pipeline_class", "omnirt_version", "tenant")
    class CacheHitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MODE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MS_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONFIG_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    COLD_START_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    BATCH_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_CLASS_FIELD_NUMBER: _ClassVar[int]
    OMNIRT_VERSION_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    schema_version: str
    run_id: str
    job_id: str
    worker_id: str
    model: str
    task: Task
    backend: str
    execution_mode: str
    device: str
    dtype: str
    queue_wait_ms: float
    timings: _containers.RepeatedCompositeFieldContainer[StageTiming]
    execution_ms: float
    peak_memory_bytes: int
    config_resolved: _struct_pb2.Struct
    cold_start: bool
    attempt: int
    batch_size: int
    batch_group_id: str
    seeds: _containers.RepeatedScalarFieldContainer[int]
    cache_hits: _containers.ScalarMap[str, int]
    trace_id: str
    warnings: _containers.RepeatedScalarFieldContainer[str]
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    pipeline_class: str
    omnirt_version: str
    tenant: str
    def __init__(self, schema_version: _Optional[str] = ..., run_id: _Optional[str] = ..., job_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., model: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., backend: _Optional[str] = ..., execution_mode: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., queue_wait_ms: _Optional[float] = ..., timings: _Optional[_Iterable[_Union[StageTiming, _Mapping]]] = ..., execution_ms: _Optional[float] = ..., peak_memory_bytes: _Optional[int] = ..., config_resolved: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., cold_start: _Optional[bool] = ..., attempt: _Optional[int] = ..., batch_size: _Optional[int] = ..., batch_group_id: _Optional[str] = ..., seeds: _Optional[_Iterable[int]] = ..., cache_hits: _Optional[_Mapping[str, int]] = ..., trace_id: _Optional[str] = ..., warnings: _Optional[_Iterable[str]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pipeline_class: _Optional[str] = ..., omnirt_version: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class GenerateResult(_message.Message):
    __slots__ = ("job_id", "artifacts", "report")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARTIFACTS_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    artifacts: _containers.RepeatedCompositeFieldContainer[Artifact]
    report: RunReport
    def __init__(self, job_id: _Optional[str] = ..., artifacts: _Optional[_Iterable[_Union[Artifact, _Mapping]]] = ..., report: _Optional[_Union[RunReport, _Mapping]] = ...) -> None: ...

class JobError(_message.Message):
    __slots__ = ("code", "message", "field")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    field: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., field: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("step", "total_steps", "stage")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    step: int
    total_steps: int
    stage: str
    def __init__(self, step: _Optional[int] = ..., total_steps: _Optional[int] = ..., stage: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "state", "model", "task", "priority", "created_at", "started_at", "finished_at", "attempts", "worker_id", "error", "result", "progress", "idempotency_key", "labels", "waiting_reason", "deadline_ms", "queue_position", "tenant", "webhook")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    WAITING_REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: JobState
    model: str
    task: Task
    priority: int
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    attempts: int
    worker_id: str
    error: JobError
    result: GenerateResult
    progress: Progress
    idempotency_key: str
    labels: _containers.ScalarMap[str, str]
    waiting_reason: str
    deadline_ms: int
    queue_position: int
    tenant: str
    webhook: Webhook
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., model: _Optional[str] = ..., task: _Optional[_Union[Task, str]] = ..., priority: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempts: _Optional[int] = ..., worker_id: _Optional[str] = ..., error: _Optional[_Union[JobError, _Mapping]] = ..., result: _Optional[_Union[GenerateResult, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., idempotency_key: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., waiting_reason: _Optional[str] = ..., deadline_ms: _Optional[int] = ..., queue_position: _Optional[int] = ..., tenant: _Optional[str] = ..., webhook: _Optional[_Union[Webhook, _Mapping]] = ...) -> None: ...

class StageEvent(_message.Message):
    __slots__ = ("name", "finished", "duration_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    finished: bool
    duration_ms: float
    def __init__(self, name: _Optional[str] = ..., finished: _Optional[bool] = ..., duration_ms: _Optional[float] = ...) -> None: ...

class StateChange(_message.Message):
    __slots__ = ("state", "worker_id", "error", "attempt")
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    worker_id: str
    error: JobError
    attempt: int
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., worker_id: _Optional[str] = ..., error: _Optional[_Union[JobError, _Mapping]] = ..., attempt: _Optional[int] = ...) -> None: ...

class Preview(_message.Message):
    __slots__ = ("step", "mime_type", "data")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    step: int
    mime_type: str
    data: bytes
    def __init__(self, step: _Optional[int] = ..., mime_type: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class LogLine(_message.Message):
    __slots__ = ("stream", "text")
    STREAM_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    stream: str
    text: str
    def __init__(self, stream: _Optional[str] = ..., text: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("job_id", "sequence", "time", "state_change", "progress", "stage", "preview", "log", "result")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    STATE_CHANGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    sequence: int
    time: _timestamp_pb2.Timestamp
    state_change: StateChange
    progress: Progress
    stage: StageEvent
    preview: Preview
    log: LogLine
    result: GenerateResult
    def __init__(self, job_id: _Optional[str] = ..., sequence: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., state_change: _Optional[_Union[StateChange, _Mapping]] = ..., progress: _Optional[_Union[Progress, _Mapping]] = ..., stage: _Optional[_Union[StageEvent, _Mapping]] = ..., preview: _Optional[_Union[Preview, _Mapping]] = ..., log: _Optional[_Union[LogLine, _Mapping]] = ..., result: _Optional[_Union[GenerateResult, _Mapping]] = ...) -> None: ...
