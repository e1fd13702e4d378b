from google.protobuf import struct_pb2 as _struct_pb2
from omnirt.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelDefaults(_message.Message):
    __slots__ = ("width", "height", "num_frames", "fps", "num_inference_steps", "guidance_scale", "scheduler", "strength", "duration_ms")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    NUM_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    GUIDANCE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_FIELD_NUMBER: _ClassVar[int]
    STRENGTH_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    width: int
    height: int
    num_frames: int
    fps: float
    num_inference_steps: int
    guidance_scale: float
    scheduler: str
    strength: float
    duration_ms: int
    def __init__(self, width: _Optional[int] = ..., height: _Optional[int] = ..., num_frames: _Optional[int] = ..., fps: _Optional[float] = ..., num_inference_steps: _Optional[int] = ..., guidance_scale: _Optional[float] = ..., scheduler: _Optional[str] = ..., strength: _Optional[float] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ModelLimits(_message.Message):
    __slots__ = ("max_width", "max_height", "max_num_frames", "max_inference_steps", "max_num_outputs", "max_batch_size", "max_prompt_chars", "max_input_bytes", "max_duration_ms")
    MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    MAX_HEIGHT_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_FRAMES_FIELD_NUMBER: _ClassVar[int]
    MAX_INFERENCE_STEPS_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_CHARS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    max_width: int
    max_height: int
    max_num_frames: int
    max_inference_steps: int
    max_num_outputs: int
    max_batch_size: int
    max_prompt_chars: int
    max_input_bytes: int
    max_duration_ms: int
    def __init__(self, max_width: _Optional[int] = ..., max_height: _Optional[int] = ..., max_num_frames: _Optional[int] = ..., max_inference_steps: _Optional[int] = ..., max_num_outputs: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_prompt_chars: _Optional[int] = ..., max_input_bytes: _Optional[int] = ..., max_duration_ms: _Optional[int] = ...) -> None: ...

class Preset(_message.Message):
    __slots__ = ("name", "description", "overrides")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    overrides: _struct_pb2.Struct
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., overrides: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ModelSpec(_message.Message):
    __slots__ = ("id", "aliases", "family", "tasks", "execution_mode", "source", "pipeline_class", "defaults", "limits", "supports_batching", "presets", "description", "runtime", "serving_workers", "streaming", "warm_on")
    ID_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_MODE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEFAULTS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SUPPORTS_BATCHING_FIELD_NUMBER: _ClassVar[int]
    PRESETS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    SERVING_WORKERS_FIELD_NUMBER: _ClassVar[int]
    STREAMING_FIELD_NUMBER: _ClassVar[int]
    WARM_ON_FIELD_NUMBER: _ClassVar[int]
    id: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    family: str
    tasks: _containers.RepeatedScalarFieldContainer[_types_pb2.Task]
    execution_mode: str
    source: str
    pipeline_class: str
    defaults: ModelDefaults
    limits: ModelLimits
    supports_batching: bool
    presets: _containers.RepeatedCompositeFieldContainer[Preset]
    description: str
    runtime: _struct_pb2.Struct
    serving_workers: int
    streaming: bool
    warm_on: _containers.RepeatedCompositeFieldContainer[WarmWorker]
    def __init__(self, id: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., family: _Optional[str] = ..., tasks: _Optional[_Iterable[_Union[_types_pb2.Task, str]]] = ..., execution_mode: _Optional[str] = ..., source: _Optional[str] = ..., pipeline_class: _Optional[str] = ..., defaults: _Optional[_Union[ModelDefaults, _Mapping]] = ..., limits: _Optional[_Union[ModelLimits, _Mapping]] = ..., supports_batching: _Optional[bool] = ..., presets: _Optional[_Iterable[_Union[Preset, _Mapping]]] = ..., description: _Optional[str] = ..., runtime: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., serving_workers: _Optional[int] = ..., streaming: _Optional[bool] = ..., warm_on: _Optional[_Iterable[_Union[WarmWorker, _Mapping]]] = ...) -> None: ...

class WarmWorker(_message.Message):
    __slots__ = ("worker_id", "memory_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    memory_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., memory_bytes: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: _types_pb2.Task
    def __init__(self, task: _Optional[_Union[_types_pb2.Task, str]] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelSpec]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelSpec, _Mapping]]] = ...) -> None: ...

class DescribeModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class DescribeModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: ModelSpec
    def __init__(self, model: _Optional[_Union[ModelSpec, _Mapping]] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("model", "workers", "worker_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    workers: int
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., workers: _Optional[int] = ..., worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelOutcome(_message.Message):
    __slots__ = ("worker_id", "loaded", "error", "load_ms", "memory_bytes", "unchanged")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    loaded: bool
    error: _types_pb2.JobError
    load_ms: float
    memory_bytes: int
    unchanged: bool
    def __init__(self, worker_id: _Optional[str] = ..., loaded: _Optional[bool] = ..., error: _Optional[_Union[_types_pb2.JobError, _Mapping]] = ..., load_ms: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("model", "outcomes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    model: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ModelOutcome]
    def __init__(self, model: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ModelOutcome, _Mapping]]] = ...) -> None: ...

class UnloadModelRequest(_message.Message):
    __slots__ = ("model", "worker_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class UnloadModelResponse(_message.Message):
    __slots__ = ("model", "outcomes")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    model: str
    outcomes: _containers.RepeatedCompositeFieldContainer[ModelOutcome]
    def __init__(self, model: _Optional[str] = ..., outcomes: _Optional[_Iterable[_Union[ModelOutcome, _Mapping]]] = ...) -> None: ...
