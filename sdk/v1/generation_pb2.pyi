from google.protobuf import struct_pb2 as _struct_pb2
from omnirt.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateResponse(_message.Message):
    __slots__ = ("result", "job")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    result: _types_pb2.GenerateResult
    job: _types_pb2.Job
    def __init__(self, result: _Optional[_Union[_types_pb2.GenerateResult, _Mapping]] = ..., job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _types_pb2.GenerateRequest
    def __init__(self, request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("job", "deduplicated")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATED_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    deduplicated: bool
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., deduplicated: _Optional[bool] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "model", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.JobState]
    model: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.JobState, str]]] = ..., model: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "after_sequence")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    after_sequence: int
    def __init__(self, job_id: _Optional[str] = ..., after_sequence: _Optional[int] = ...) -> None: ...

class WatchJobResponse(_message.Message):
    __slots__ = ("event",)
    EVENT_FIELD_NUMBER: _ClassVar[int]
    event: _types_pb2.JobEvent
    def __init__(self, event: _Optional[_Union[_types_pb2.JobEvent, _Mapping]] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job", "cancelled")
    JOB_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    cancelled: bool
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., cancelled: _Optional[bool] = ...) -> None: ...

class ValidateRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _types_pb2.GenerateRequest
    def __init__(self, request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ...) -> None: ...

class ValidateResponse(_message.Message):
    __slots__ = ("model", "task", "execution_mode", "config_resolved", "warnings")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MODE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_RESOLVED_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    task: _types_pb2.Task
    execution_mode: str
    config_resolved: _struct_pb2.Struct
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., task: _Optional[_Union[_types_pb2.Task, str]] = ..., execution_mode: _Optional[str] = ..., config_resolved: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...

class DownloadArtifactRequest(_message.Message):
    __slots__ = ("job_id", "index")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    index: int
    def __init__(self, job_id: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class DownloadArtifactResponse(_message.Message):
    __slots__ = ("chunk", "artifact")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ARTIFACT_FIELD_NUMBER: _ClassVar[int]
    chunk: bytes
    artifact: _types_pb2.Artifact
    def __init__(self, chunk: _Optional[bytes] = ..., artifact: _Optional[_Union[_types_pb2.Artifact, _Mapping]] = ...) -> None: ...

class GetWebhookSecretRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class GetWebhookSecretResponse(_message.Message):
    __slots__ = ("secret", "tenant")
    SECRET_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    secret: str
    tenant: str
    def __init__(self, secret: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...
