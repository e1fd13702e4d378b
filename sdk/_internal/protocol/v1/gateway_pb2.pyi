from omnirt.v1 import models_pb2 as _models_pb2
from omnirt.v1 import realtime_pb2 as _realtime_pb2
from omnirt.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Hello(_message.Message):
    __slots__ = ("worker_id", "execution_mode", "backend", "models", "slots", "loaded_models", "hostname", "pid", "version", "labels", "token", "accepts_batches", "instance_id", "reports_running", "session_slots", "loads_models", "step_rows", "step_pipelines", "device")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MODE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOADED_MODELS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTS_RUNNING_FIELD_NUMBER: _ClassVar[int]
    SESSION_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOADS_MODELS_FIELD_NUMBER: _ClassVar[int]
    STEP_ROWS_FIELD_NUMBER: _ClassVar[int]
    STEP_PIPELINES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    execution_mode: str
    backend: str
    models: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    loaded_models: _containers.RepeatedScalarFieldContainer[str]
    hostname: str
    pid: int
    version: str
    labels: _containers.ScalarMap[str, str]
    token: str
    accepts_batches: bool
    instance_id: str
    reports_running: bool
    session_slots: int
    loads_models: bool
    step_rows: int
    step_pipelines: _containers.RepeatedScalarFieldContainer[str]
    device: str
    def __init__(self, worker_id: _Optional[str] = ..., execution_mode: _Optional[str] = ..., backend: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., loaded_models: _Optional[_Iterable[str]] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., token: _Optional[str] = ..., accepts_batches: _Optional[bool] = ..., instance_id: _Optional[str] = ..., reports_running: _Optional[bool] = ..., session_slots: _Optional[int] = ..., loads_models: _Optional[bool] = ..., step_rows: _Optional[int] = ..., step_pipelines: _Optional[_Iterable[str]] = ..., device: _Optional[str] = ...) -> None: ...

class RunningJob(_message.Message):
    __slots__ = ("assignment_id", "job_id")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    job_id: str
    def __init__(self, assignment_id: _Optional[str] = ..., job_id: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("busy_slots", "loaded_models", "memory_bytes", "draining", "running", "sessions", "loaded", "jobs_succeeded", "jobs_failed")
    BUSY_SLOTS_FIELD_NUMBER: _ClassVar[int]
    LOADED_MODELS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    JOBS_SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    busy_slots: int
    loaded_models: _containers.RepeatedScalarFieldContainer[str]
    memory_bytes: int
    draining: bool
    running: _containers.RepeatedCompositeFieldContainer[RunningJob]
    sessions: _containers.RepeatedScalarFieldContainer[str]
    loaded: _containers.RepeatedCompositeFieldContainer[LoadedModel]
    jobs_succeeded: int
    jobs_failed: int
    def __init__(self, busy_slots: _Optional[int] = ..., loaded_models: _Optional[_Iterable[str]] = ..., memory_bytes: _Optional[int] = ..., draining: _Optional[bool] = ..., running: _Optional[_Iterable[_Union[RunningJob, _Mapping]]] = ..., sessions: _Optional[_Iterable[str]] = ..., loaded: _Optional[_Iterable[_Union[LoadedModel, _Mapping]]] = ..., jobs_succeeded: _Optional[int] = ..., jobs_failed: _Optional[int] = ...) -> None: ...

class LoadedModel(_message.Message):
    __slots__ = ("model_id", "memory_bytes")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    memory_bytes: int
    def __init__(self, model_id: _Optional[str] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class AssignmentItem(_message.Message):
    __slots__ = ("job_id", "request", "attempt", "queue_wait_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    request: _types_pb2.GenerateRequest
    attempt: int
    queue_wait_ms: float
    def __init__(self, job_id: _Optional[str] = ..., request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ..., attempt: _Optional[int] = ..., queue_wait_ms: _Optional[float] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("assignment_id", "items", "model", "deadline_ms", "trace_context", "batch_group_id", "joins_batch")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    BATCH_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    JOINS_BATCH_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    items: _containers.RepeatedCompositeFieldContainer[AssignmentItem]
    model: _models_pb2.ModelSpec
    deadline_ms: int
    trace_context: _containers.ScalarMap[str, str]
    batch_group_id: str
    joins_batch: bool
    def __init__(self, assignment_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[AssignmentItem, _Mapping]]] = ..., model: _Optional[_Union[_models_pb2.ModelSpec, _Mapping]] = ..., deadline_ms: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., batch_group_id: _Optional[str] = ..., joins_batch: _Optional[bool] = ...) -> None: ...

class AssignmentEvent(_message.Message):
    __slots__ = ("assignment_id", "event")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    event: _types_pb2.JobEvent
    def __init__(self, assignment_id: _Optional[str] = ..., event: _Optional[_Union[_types_pb2.JobEvent, _Mapping]] = ...) -> None: ...

class AssignmentResult(_message.Message):
    __slots__ = ("assignment_id", "job_id", "result", "error")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    job_id: str
    result: _types_pb2.GenerateResult
    error: _types_pb2.JobError
    def __init__(self, assignment_id: _Optional[str] = ..., job_id: _Optional[str] = ..., result: _Optional[_Union[_types_pb2.GenerateResult, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.JobError, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("worker_id", "heartbeat_interval_ms", "lease_timeout_ms", "accepts_batches", "warnings", "artifact_store")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_STORE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    heartbeat_interval_ms: int
    lease_timeout_ms: int
    accepts_batches: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    artifact_store: str
    def __init__(self, worker_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., lease_timeout_ms: _Optional[int] = ..., accepts_batches: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ..., artifact_store: _Optional[str] = ...) -> None: ...

class CancelAssignment(_message.Message):
    __slots__ = ("assignment_id", "job_id", "reason")
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    assignment_id: str
    job_id: str
    reason: str
    def __init__(self, assignment_id: _Optional[str] = ..., job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ConnectRequestBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ConnectRequest]
    def __init__(self, messages: _Optional[_Iterable[_Union[ConnectRequest, _Mapping]]] = ...) -> None: ...

class ConnectResponseBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ConnectResponse]
    def __init__(self, messages: _Optional[_Iterable[_Union[ConnectResponse, _Mapping]]] = ...) -> None: ...

class SessionOffer(_message.Message):
    __slots__ = ("session_id", "model", "open", "trace_context", "deadline_ms")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: _models_pb2.ModelSpec
    open: _realtime_pb2.SessionOpen
    trace_context: _containers.ScalarMap[str, str]
    deadline_ms: int
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[_Union[_models_pb2.ModelSpec, _Mapping]] = ..., open: _Optional[_Union[_realtime_pb2.SessionOpen, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class SessionAttach(_message.Message):
    __slots__ = ("session_id", "worker_id", "instance_id", "token")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    worker_id: str
    instance_id: str
    token: str
    def __init__(self, session_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class WorkerSessionRequest(_message.Message):
    __slots__ = ("attach", "ready", "chunk", "progress", "closed", "error")
    ATTACH_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    attach: SessionAttach
    ready: _realtime_pb2.SessionReady
    chunk: _realtime_pb2.OutputChunk
    progress: _realtime_pb2.SessionProgress
    closed: _realtime_pb2.SessionClosed
    error: _types_pb2.JobError
    def __init__(self, attach: _Optional[_Union[SessionAttach, _Mapping]] = ..., ready: _Optional[_Union[_realtime_pb2.SessionReady, _Mapping]] = ..., chunk: _Optional[_Union[_realtime_pb2.OutputChunk, _Mapping]] = ..., progress: _Optional[_Union[_realtime_pb2.SessionProgress, _Mapping]] = ..., closed: _Optional[_Union[_realtime_pb2.SessionClosed, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.JobError, _Mapping]] = ...) -> None: ...

class WorkerSessionResponse(_message.Message):
    __slots__ = ("input", "stop")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    input: _realtime_pb2.SessionRequest
    stop: str
    def __init__(self, input: _Optional[_Union[_realtime_pb2.SessionRequest, _Mapping]] = ..., stop: _Optional[str] = ...) -> None: ...

class LoadModel(_message.Message):
    __slots__ = ("request_id", "model")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: _models_pb2.ModelSpec
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[_Union[_models_pb2.ModelSpec, _Mapping]] = ...) -> None: ...

class UnloadModel(_message.Message):
    __slots__ = ("request_id", "model_id", "deadline_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model_id: str
    deadline_ms: int
    def __init__(self, request_id: _Optional[str] = ..., model_id: _Optional[str] = ..., deadline_ms: _Optional[int] = ...) -> None: ...

class ModelLoaded(_message.Message):
    __slots__ = ("request_id", "model_id", "ok", "error", "load_ms", "memory_bytes", "unchanged")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model_id: str
    ok: bool
    error: _types_pb2.JobError
    load_ms: float
    memory_bytes: int
    unchanged: bool
    def __init__(self, request_id: _Optional[str] = ..., model_id: _Optional[str] = ..., ok: _Optional[bool] = ..., error: _Optional[_Union[_types_pb2.JobError, _Mapping]] = ..., load_ms: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class ConnectRequest(_message.Message):
    __slots__ = ("hello", "heartbeat", "event", "result", "batch", "model_loaded")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MODEL_LOADED_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    event: AssignmentEvent
    result: AssignmentResult
    batch: ConnectRequestBatch
    model_loaded: ModelLoaded
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., event: _Optional[_Union[AssignmentEvent, _Mapping]] = ..., result: _Optional[_Union[AssignmentResult, _Mapping]] = ..., batch: _Optional[_Union[ConnectRequestBatch, _Mapping]] = ..., model_loaded: _Optional[_Union[ModelLoaded, _Mapping]] = ...) -> None: ...

class ConnectResponse(_message.Message):
    __slots__ = ("welcome", "assignment", "cancel", "drain", "batch", "session_offer", "load_model", "unload_model")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_OFFER_FIELD_NUMBER: _ClassVar[int]
    LOAD_MODEL_FIELD_NUMBER: _ClassVar[int]
    UNLOAD_MODEL_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    assignment: Assignment
    cancel: CancelAssignment
    drain: Drain
    batch: ConnectResponseBatch
    session_offer: SessionOffer
    load_model: LoadModel
    unload_model: UnloadModel
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., cancel: _Optional[_Union[CancelAssignment, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., batch: _Optional[_Union[ConnectResponseBatch, _Mapping]] = ..., session_offer: _Optional[_Union[SessionOffer, _Mapping]] = ..., load_model: _Optional[_Union[LoadModel, _Mapping]] = ..., unload_model: _Optional[_Union[UnloadModel, _Mapping]] = ...) -> None: ...
