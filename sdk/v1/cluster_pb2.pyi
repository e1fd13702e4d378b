import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_READY: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
    WORKER_STATE_GONE: _ClassVar[WorkerState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_READY: WorkerState
WORKER_STATE_DRAINING: WorkerState
WORKER_STATE_GONE: WorkerState

class WorkerInfo(_message.Message):
    __slots__ = ("id", "state", "execution_mode", "backend", "models", "loaded_models", "slots", "busy_slots", "hostname", "pid", "version", "connected_at", "last_heartbeat_at", "labels", "running_job_ids", "unknown_models", "instance_id", "step_rows", "step_pipelines", "jobs_succeeded", "jobs_failed", "device")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MODE_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    LOADED_MODELS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_SLOTS_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_MODELS_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_ROWS_FIELD_NUMBER: _ClassVar[int]
    STEP_PIPELINES_FIELD_NUMBER: _ClassVar[int]
    JOBS_SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    JOBS_FAILED_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: WorkerState
    execution_mode: str
    backend: str
    models: _containers.RepeatedScalarFieldContainer[str]
    loaded_models: _containers.RepeatedScalarFieldContainer[str]
    slots: int
    busy_slots: int
    hostname: str
    pid: int
    version: str
    connected_at: _timestamp_pb2.Timestamp
    last_heartbeat_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    running_job_ids: _containers.RepeatedScalarFieldContainer[str]
    unknown_models: _containers.RepeatedScalarFieldContainer[str]
    instance_id: str
    step_rows: int
    step_pipelines: _containers.RepeatedScalarFieldContainer[str]
    jobs_succeeded: int
    jobs_failed: int
    device: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., execution_mode: _Optional[str] = ..., backend: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., loaded_models: _Optional[_Iterable[str]] = ..., slots: _Optional[int] = ..., busy_slots: _Optional[int] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., version: _Optional[str] = ..., connected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., running_job_ids: _Optional[_Iterable[str]] = ..., unknown_models: _Optional[_Iterable[str]] = ..., instance_id: _Optional[str] = ..., step_rows: _Optional[int] = ..., step_pipelines: _Optional[_Iterable[str]] = ..., jobs_succeeded: _Optional[int] = ..., jobs_failed: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class DrainWorkerResponse(_message.Message):
    __slots__ = ("worker",)
    WORKER_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerInfo
    def __init__(self, worker: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "model", "worker_id", "controller", "tenant", "opened_at", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    worker_id: str
    controller: str
    tenant: str
    opened_at: _timestamp_pb2.Timestamp
    labels: _containers.ScalarMap[str, str]
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., worker_id: _Optional[str] = ..., controller: _Optional[str] = ..., tenant: _Optional[str] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ("sessions",)
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...
