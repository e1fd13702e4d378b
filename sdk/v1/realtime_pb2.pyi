from google.protobuf import struct_pb2 as _struct_pb2
from omnirt.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionOpen(_message.Message):
    __slots__ = ("model", "inputs", "video_encoding", "audio_format", "sample_rate", "fps", "width", "height", "labels", "config", "idle_timeout_ms")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    VIDEO_ENCODING_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FORMAT_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedCompositeFieldContainer[_types_pb2.MediaInput]
    video_encoding: str
    audio_format: str
    sample_rate: int
    fps: float
    width: int
    height: int
    labels: _containers.ScalarMap[str, str]
    config: _struct_pb2.Struct
    idle_timeout_ms: int
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[_Union[_types_pb2.MediaInput, _Mapping]]] = ..., video_encoding: _Optional[str] = ..., audio_format: _Optional[str] = ..., sample_rate: _Optional[int] = ..., fps: _Optional[float] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., config: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., idle_timeout_ms: _Optional[int] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("sequence", "data")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    data: bytes
    def __init__(self, sequence: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class TextInput(_message.Message):
    __slots__ = ("text", "voice")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ...) -> None: ...

class Interrupt(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndInput(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("open", "audio", "text", "interrupt", "end")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INTERRUPT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    open: SessionOpen
    audio: AudioChunk
    text: TextInput
    interrupt: Interrupt
    end: EndInput
    def __init__(self, open: _Optional[_Union[SessionOpen, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., text: _Optional[_Union[TextInput, _Mapping]] = ..., interrupt: _Optional[_Union[Interrupt, _Mapping]] = ..., end: _Optional[_Union[EndInput, _Mapping]] = ...) -> None: ...

class SessionReady(_message.Message):
    __slots__ = ("session_id", "model", "trace_id", "chunk_samples", "sample_rate", "channels", "audio_format", "video_encoding", "fps", "width", "height", "frames_per_chunk", "max_buffered_samples")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    CHANNELS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FORMAT_FIELD_NUMBER: _ClassVar[int]
    VIDEO_ENCODING_FIELD_NUMBER: _ClassVar[int]
    FPS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    FRAMES_PER_CHUNK_FIELD_NUMBER: _ClassVar[int]
    MAX_BUFFERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    model: str
    trace_id: str
    chunk_samples: int
    sample_rate: int
    channels: int
    audio_format: str
    video_encoding: str
    fps: float
    width: int
    height: int
    frames_per_chunk: int
    max_buffered_samples: int
    def __init__(self, session_id: _Optional[str] = ..., model: _Optional[str] = ..., trace_id: _Optional[str] = ..., chunk_samples: _Optional[int] = ..., sample_rate: _Optional[int] = ..., channels: _Optional[int] = ..., audio_format: _Optional[str] = ..., video_encoding: _Optional[str] = ..., fps: _Optional[float] = ..., width: _Optional[int] = ..., height: _Optional[int] = ..., frames_per_chunk: _Optional[int] = ..., max_buffered_samples: _Optional[int] = ...) -> None: ...

class OutputChunk(_message.Message):
    __slots__ = ("sequence", "pts_ms", "duration_ms", "frames", "segment", "audio", "sample_rate", "latency_ms")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    PTS_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    pts_ms: float
    duration_ms: float
    frames: _containers.RepeatedScalarFieldContainer[bytes]
    segment: bytes
    audio: bytes
    sample_rate: int
    latency_ms: float
    def __init__(self, sequence: _Optional[int] = ..., pts_ms: _Optional[float] = ..., duration_ms: _Optional[float] = ..., frames: _Optional[_Iterable[bytes]] = ..., segment: _Optional[bytes] = ..., audio: _Optional[bytes] = ..., sample_rate: _Optional[int] = ..., latency_ms: _Optional[float] = ...) -> None: ...

class SessionProgress(_message.Message):
    __slots__ = ("chunks_in", "chunks_out", "lag_ms", "buffered_samples")
    CHUNKS_IN_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_OUT_FIELD_NUMBER: _ClassVar[int]
    LAG_MS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    chunks_in: int
    chunks_out: int
    lag_ms: float
    buffered_samples: int
    def __init__(self, chunks_in: _Optional[int] = ..., chunks_out: _Optional[int] = ..., lag_ms: _Optional[float] = ..., buffered_samples: _Optional[int] = ...) -> None: ...

class SessionReport(_message.Message):
    __slots__ = ("chunks_in", "chunks_out", "first_chunk_latency_ms", "mean_chunk_latency_ms", "real_time_factor", "underruns", "duration_ms", "worker_id", "audio_ms")
    CHUNKS_IN_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_OUT_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_CHUNK_LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    REAL_TIME_FACTOR_FIELD_NUMBER: _ClassVar[int]
    UNDERRUNS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AUDIO_MS_FIELD_NUMBER: _ClassVar[int]
    chunks_in: int
    chunks_out: int
    first_chunk_latency_ms: float
    mean_chunk_latency_ms: float
    real_time_factor: float
    underruns: int
    duration_ms: float
    worker_id: str
    audio_ms: float
    def __init__(self, chunks_in: _Optional[int] = ..., chunks_out: _Optional[int] = ..., first_chunk_latency_ms: _Optional[float] = ..., mean_chunk_latency_ms: _Optional[float] = ..., real_time_factor: _Optional[float] = ..., underruns: _Optional[int] = ..., duration_ms: _Optional[float] = ..., worker_id: _Optional[str] = ..., audio_ms: _Optional[float] = ...) -> None: ...

class SessionClosed(_message.Message):
    __slots__ = ("reason", "report")
    REASON_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    reason: str
    report: SessionReport
    def __init__(self, reason: _Optional[str] = ..., report: _Optional[_Union[SessionReport, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("ready", "chunk", "progress", "closed")
    READY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    ready: SessionReady
    chunk: OutputChunk
    progress: SessionProgress
    closed: SessionClosed
    def __init__(self, ready: _Optional[_Union[SessionReady, _Mapping]] = ..., chunk: _Optional[_Union[OutputChunk, _Mapping]] = ..., progress: _Optional[_Union[SessionProgress, _Mapping]] = ..., closed: _Optional[_Union[SessionClosed, _Mapping]] = ...) -> None: ...
