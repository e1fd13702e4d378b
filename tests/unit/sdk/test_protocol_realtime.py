"""A realtime session's messages and their converters each way (omnirt._internal.protocol.realtime).

Every message of both session streams goes through its wire form and back unchanged, so the
client, the controller and the worker read what the others wrote; then what a side does not
know (an empty message, a newer kind, `open` relayed to a worker) and the NaN a SessionOpen's
config may carry.
"""

from __future__ import annotations

import math

import pytest

from omnirt import types as t
from omnirt._internal.protocol import realtime as wire
from omnirt._internal.protocol.messages import SessionSettings
from omnirt._internal.protocol.v1 import gateway_pb2 as gw
from omnirt.v1 import realtime_pb2 as rt

REPORT = wire.SessionReport(3, 3, 120.5, 90.25, 1.5, 1, 4000.0, "w-1", 3360.0)
OUTPUT: list[wire.SessionOutput] = [
    wire.SessionReady("sess-1", "tiny-talking-head", "ab" * 16, 17920, 16000, 1, "pcm_s16le", "jpeg", 25.0),
    wire.SessionReady(width=64, height=64, frames_per_chunk=28, max_buffered_samples=71680),
    wire.OutputChunk(1, 0.0, 1120.0, [b"\xff\xd8a", b"\xff\xd8b"], b"", b"\x01\x00" * 4, 16000, 12.5),
    wire.OutputChunk(2, 1120.0, 1120.0, [], b"\x00\x00\x00\x18ftyp", b"", 16000, 3.0),
    wire.SessionProgress(2, 1, 40.0, 512),
    wire.SessionClosed("ended", REPORT),
    wire.SessionFailed(t.JobError("INVALID_ARGUMENT", "audio.data: odd", "audio.data")),
]
INPUT: list[wire.SessionInput] = [
    wire.AudioChunk(7, b"\x01\x02" * 8),
    wire.AudioChunk(0, b""),
    wire.TextInput("hello there", "alto"),
    wire.Interrupt(),
    wire.EndInput(),
]


@pytest.mark.parametrize("message", [wire.SessionAttach("sess-1", "w-1", "i-1", "tok"), *OUTPUT])
def test_what_a_worker_sends_reads_back_unchanged_at_the_controller(
    message: wire.WorkerSessionMessage,
) -> None:
    sent = wire.to_controller(message)
    assert wire.from_worker(gw.WorkerSessionRequest.FromString(sent.SerializeToString())) == message


@pytest.mark.parametrize("message", [*INPUT, wire.Stop("idle_timeout")])
def test_what_the_controller_relays_reads_back_unchanged_at_the_worker(
    message: wire.ControllerSessionMessage,
) -> None:
    sent = wire.to_worker(message)
    assert wire.from_controller(gw.WorkerSessionResponse.FromString(sent.SerializeToString())) == message


@pytest.mark.parametrize("message", INPUT)
def test_a_clients_input_reads_back_unchanged(message: wire.SessionInput) -> None:
    sent = wire.request_to_proto(message)
    assert wire.request_from_proto(rt.SessionRequest.FromString(sent.SerializeToString())) == message


@pytest.mark.parametrize("message", [m for m in OUTPUT if not isinstance(m, wire.SessionFailed)])
def test_what_the_client_receives_is_what_the_worker_sent(message: wire.SessionResponse) -> None:
    # The controller passes the worker's message on: the client's SessionResponse holds the same
    # submessage, field for field, as the worker's WorkerSessionRequest.
    response = wire.response_to_proto(message)
    request = wire.to_controller(message)
    kind = response.WhichOneof("message")
    assert kind == request.WhichOneof("message")
    assert getattr(response, kind) == getattr(request, kind)


def test_a_session_open_reads_as_its_settings_keeping_a_nan_for_the_controller_to_refuse() -> None:
    settings = SessionSettings(
        model="tiny-talking-head",
        inputs=[t.MediaInput(t.MediaRole.IMAGE, data=b"png", mime_type="image/png")],
        video_encoding="fmp4",
        audio_format="pcm_s16le",
        sample_rate=16000,
        fps=25.0,
        width=64,
        height=64,
        labels={"room": "7"},
        config={"seed": 7.0, "nested": {"steps": [1.0, 2.0]}},
        idle_timeout_ms=5000,
    )
    sent = wire.request_to_proto(settings)
    assert wire.request_from_proto(rt.SessionRequest.FromString(sent.SerializeToString())) == settings
    sent.open.config["seed"] = math.nan
    read = wire.request_from_proto(sent)
    assert isinstance(read, SessionSettings) and math.isnan(read.config["seed"])


def test_what_a_side_does_not_know_reads_as_none() -> None:
    assert wire.request_from_proto(rt.SessionRequest()) is None
    assert wire.from_worker(gw.WorkerSessionRequest()) is None
    assert wire.from_controller(gw.WorkerSessionResponse()) is None
    # `open` is the client's first message only: relayed again to a worker, it is ignored there.
    relayed = gw.WorkerSessionResponse(input=rt.SessionRequest(open=rt.SessionOpen(model="x")))
    assert wire.from_controller(relayed) is None
