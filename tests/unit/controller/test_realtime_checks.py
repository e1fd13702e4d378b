"""What the controller refuses of a session, on the plain messages its edges convert to.

`check_open` and `check_input` (controller/realtime/manager.py) name the field of a SessionOpen
or an input message; the WebSocket route's session.create (controller/realtime/websocket.py)
takes a SessionOpen field's value exactly where protobuf would, so both edges refuse alike.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from omnirt import types as t
from omnirt._internal.protocol import realtime as wire
from omnirt._internal.protocol.messages import SessionSettings
from omnirt.controller.realtime.manager import check_input, check_open
from omnirt.controller.realtime.websocket import OPEN_FIELDS, edge_options, session_open
from omnirt.errors import InvalidRequest
from omnirt.v1 import realtime_pb2 as rt

IMAGE = t.MediaInput(t.MediaRole.IMAGE, data=b"png")
HUGE = t.MediaInput(t.MediaRole.IMAGE, data=b"x" * ((32 << 20) + 1))


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (SessionSettings(inputs=[IMAGE, IMAGE]), "inputs"),
        (SessionSettings(inputs=[t.MediaInput(t.MediaRole.MASK, data=b"x")]), "inputs"),
        (SessionSettings(inputs=[t.MediaInput(t.MediaRole.IMAGE, uri="http://x/y.png")]), "inputs.uri"),
        (
            SessionSettings(inputs=[t.MediaInput(t.MediaRole.IMAGE, data=b"x" * ((32 << 20) + 1))]),
            "inputs.data",
        ),
        (SessionSettings(video_encoding="h264"), "video_encoding"),
        (SessionSettings(audio_format="mp3"), "audio_format"),
        (SessionSettings(fps=math.nan), "fps"),
        (SessionSettings(fps=241.0), "fps"),
        (SessionSettings(width=8193), "width"),
        (SessionSettings(sample_rate=192_001), "sample_rate"),
        (SessionSettings(idle_timeout_ms=10**9), "idle_timeout_ms"),
        (SessionSettings(labels={"k": "v" * 1000}), "labels.k"),
        (SessionSettings(config={"seed": math.nan}), "extra.seed"),
    ],
)
def test_a_bad_open_is_refused_naming_the_field(settings: SessionSettings, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_open(settings)
    assert refused.value.field == field, refused.value.message


def test_a_good_open_passes() -> None:
    check_open(
        SessionSettings(model="m", inputs=[IMAGE], video_encoding="jpeg", fps=25.0, config={"seed": 7.0})
    )


@pytest.mark.parametrize(
    ("message", "field", "text"),
    [
        (None, "message", "an empty SessionRequest"),
        (SessionSettings(model="m"), "open", "SessionOpen is the first message only"),
        (wire.AudioChunk(data=b"\0" * ((1 << 20) + 2)), "audio.data", "at most 1048576 bytes a message"),
        (wire.TextInput("x" * 4097), "text.text", "at most 4096 characters"),
        (wire.TextInput("hi", "v" * 129), "text.voice", "at most 128 characters"),
    ],
)
def test_a_bad_input_is_refused_naming_the_field(message: Any, field: str, text: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        check_input(message)
    assert refused.value.field == field and text in refused.value.message


@pytest.mark.parametrize("message", [wire.AudioChunk(1, b"\0\0"), wire.TextInput("hi"), wire.Interrupt()])
def test_a_good_input_passes_as_it_is(message: wire.SessionInput) -> None:
    assert check_input(message) is message


VALUES = [0, 5, 2**32 - 1, 2**32, -1, True, False, 5.0, 5.5, math.nan, math.inf, 10**400, "5", "jpeg", None]


@pytest.mark.parametrize("name", OPEN_FIELDS)
@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_session_create_takes_a_field_where_protobuf_would(name: str, value: Any) -> None:
    message = rt.SessionOpen()
    try:
        setattr(message, name, value)
        expected: Any = getattr(message, name)
    except (TypeError, ValueError, OverflowError):
        expected = None
    create = {"type": "session.create", "model": "m", "config": {name: value}}
    if expected is None:
        with pytest.raises(InvalidRequest) as refused:
            session_open(create)
        assert refused.value.field == f"config.{name}"
    else:
        got = getattr(session_open(create), name)
        assert got == expected or (math.isnan(got) and math.isnan(expected))
        assert type(got) is type(expected)


def test_session_create_reads_like_a_session_open() -> None:
    create = {
        "type": "session.create",
        "model": "tiny-talking-head",
        "inputs": {"image_b64": "cG5n"},
        "config": {"fps": 25, "width": 64, "labels": {"room": "7"}, "seed": 7},
    }
    assert session_open(create) == SessionSettings(
        model="tiny-talking-head",
        inputs=[t.MediaInput(t.MediaRole.IMAGE, data=b"png")],
        fps=25.0,
        width=64,
        labels={"room": "7"},
        config={"seed": 7.0},  # through a Struct, as over gRPC: numbers are floats
    )


def test_the_originals_chunk_samples_is_the_edges_and_never_reaches_the_model() -> None:
    create = {"type": "session.create", "model": "m", "config": {"chunk_samples": 17920, "seed": 7}}
    assert session_open(create).config == {"seed": 7.0}
    assert edge_options(create) == (17920, False)
    assert edge_options({**create, "config": {}, "progress": True}) == (0, True)


@pytest.mark.parametrize("value", [-1, 2**32, 16.5, 16.0, True, "16", None])
def test_a_chunk_samples_that_is_no_sample_count_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(InvalidRequest) as refused:
        session_open({"type": "session.create", "model": "m", "config": {"chunk_samples": value}})
    assert refused.value.field == "config.chunk_samples"


def test_progress_is_true_or_false() -> None:
    with pytest.raises(InvalidRequest) as refused:
        edge_options({"type": "session.create", "model": "m", "progress": "yes"})
    assert refused.value.field == "progress"
