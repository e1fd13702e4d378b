"""The controller's side of realtime sessions: admission, placement, the relay both ways,
idle timeout, a client or worker gone, bad input; on a real controller daemon.

The worker here is a scripted peer speaking the worker protocol over real gRPC (Connect with
`session_slots`, then one WorkerSession stream per offered session): it answers each audio
chunk with one output chunk at once, so these tests see the controller alone. The real worker
and its talking-head model are tested end to end in test_realtime_sessions.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from omnirt._internal.protocol.v1 import gateway_pb2 as gw
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.v1 import realtime_pb2 as rt
from omnirt.v1 import realtime_pb2_grpc, types_pb2
from tests.daemons import Controller

MODEL = "tiny-talking-head"
CHUNK = 17920


class ScriptedWorker:
    """A worker process as the controller sees it: Connect, then WorkerSession per offer."""

    def __init__(self, address: str, worker_id: str, slots: int) -> None:
        self.address, self.worker_id, self.slots = address, worker_id, slots
        self.instance_id = uuid.uuid4().hex
        self.stops: list[str] = []
        self.inputs: list[str] = []
        self.trace_contexts: list[dict[str, str]] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> ScriptedWorker:
        self.channel = grpc.aio.insecure_channel(self.address)
        self.stub = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel)
        self.connect = self.stub.Connect()
        hello = gw.Hello(
            worker_id=self.worker_id,
            execution_mode="legacy_call",
            backend="cpu",
            models=[MODEL],
            slots=1,
            instance_id=self.instance_id,
            session_slots=self.slots,
        )
        await self.connect.write(gw.ConnectRequest(hello=hello))
        welcome = await self.connect.read()
        assert welcome.WhichOneof("message") == "welcome"
        self._tasks.append(asyncio.create_task(self._offers()))
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.lose()

    async def lose(self) -> None:
        """The worker process is gone: its streams close."""
        for task in self._tasks:
            task.cancel()
        await self.channel.close()

    async def _offers(self) -> None:
        while True:
            message = await self.connect.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("message") == "session_offer":
                self._tasks.append(asyncio.create_task(self._host(message.session_offer)))

    async def _host(self, offer: gw.SessionOffer) -> None:
        self.trace_contexts.append(dict(offer.trace_context))
        call = self.stub.WorkerSession()
        await call.write(
            gw.WorkerSessionRequest(
                attach=gw.SessionAttach(
                    session_id=offer.session_id, worker_id=self.worker_id, instance_id=self.instance_id
                )
            )
        )
        ready = rt.SessionReady(
            chunk_samples=CHUNK, sample_rate=16000, channels=1, audio_format="pcm_s16le",
            video_encoding="jpeg", fps=25, width=64, height=64, frames_per_chunk=28,
        )  # fmt: skip
        await call.write(gw.WorkerSessionRequest(ready=ready))
        sequence = 0
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            if message.WhichOneof("message") == "stop":
                self.stops.append(message.stop)
                closed = rt.SessionClosed(reason=message.stop, report=rt.SessionReport(chunks_out=sequence))
                await call.write(gw.WorkerSessionRequest(closed=closed))
                await call.done_writing()
                return
            kind = message.input.WhichOneof("message")
            self.inputs.append(kind)
            if kind == "audio":
                sequence += 1
                chunk = rt.OutputChunk(
                    sequence=sequence, pts_ms=(sequence - 1) * 1120.0, frames=[b"jpeg"] * 28,
                    audio=message.input.audio.data,
                )  # fmt: skip
                await call.write(gw.WorkerSessionRequest(chunk=chunk))
            elif kind == "end":
                closed = rt.SessionClosed(reason="ended", report=rt.SessionReport(chunks_out=sequence))
                await call.write(gw.WorkerSessionRequest(closed=closed))
                await call.done_writing()
                return


def open_message(**fields: Any) -> rt.SessionRequest:
    fields.setdefault("model", MODEL)
    fields.setdefault("inputs", [types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_IMAGE, data=b"png")])
    return rt.SessionRequest(open=rt.SessionOpen(**fields))


def audio(index: int) -> rt.SessionRequest:
    return rt.SessionRequest(audio=rt.AudioChunk(data=bytes([index]) * (2 * CHUNK)))


END = rt.SessionRequest(end=rt.EndInput())


class ClientSession:
    """A client's Session call with a queue to write from."""

    def __init__(
        self, stub: realtime_pb2_grpc.RealtimeServiceStub, first: rt.SessionRequest, metadata: Any = None
    ) -> None:
        self.outgoing: asyncio.Queue[rt.SessionRequest | None] = asyncio.Queue()
        self.outgoing.put_nowait(first)
        self.call = stub.Session(self._requests(), metadata=metadata)

    async def _requests(self) -> AsyncIterator[rt.SessionRequest]:
        while (message := await self.outgoing.get()) is not None:
            yield message

    def send(self, *messages: rt.SessionRequest | None) -> None:
        for message in messages:
            self.outgoing.put_nowait(message)

    async def read(self) -> rt.SessionResponse:
        async with asyncio.timeout(20):
            message = await self.call.read()
        assert message is not grpc.aio.EOF, "the session ended early"
        return message

    async def status(self) -> grpc.aio.AioRpcError:
        """The error the call ends with (read until it comes)."""
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            async with asyncio.timeout(20):
                while await self.call.read() is not grpc.aio.EOF:
                    pass
        return failed.value


def run(controller: Controller, scenario: Callable[[Any], Awaitable[None]]) -> None:
    async def go() -> None:
        async with grpc.aio.insecure_channel(controller.address) as channel:
            await scenario(realtime_pb2_grpc.RealtimeServiceStub(channel))

    asyncio.run(go())


def field_of(error: grpc.aio.AioRpcError) -> str:
    return dict(error.trailing_metadata() or ()).get("omnirt-error-field", "")


@pytest.fixture(scope="module")
def controller(log_dir: Path) -> Any:
    daemon = Controller(log_dir, http=True).start()
    yield daemon
    daemon.stop()


def test_a_session_relays_every_chunk_in_order_and_closes_when_input_ends(controller: Controller) -> None:
    async def scenario(stub: Any) -> None:
        async with ScriptedWorker(controller.address, "w-relay", slots=1) as worker:
            session = ClientSession(stub, open_message())
            ready = (await session.read()).ready
            assert ready.session_id.startswith("sess-") and ready.model == MODEL
            assert (ready.chunk_samples, ready.fps, ready.frames_per_chunk) == (CHUNK, 25, 28)
            assert len(ready.trace_id) == 32
            session.send(audio(1), audio(2), audio(3), END)
            chunks = [(await session.read()).chunk for _ in range(3)]
            assert [c.sequence for c in chunks] == [1, 2, 3]
            assert [c.audio[:1] for c in chunks] == [b"\x01", b"\x02", b"\x03"], "each with its audio"
            closed = (await session.read()).closed
            assert closed.reason == "ended" and closed.report.chunks_out == 3
            assert await session.call.read() is grpc.aio.EOF
            assert await session.call.code() == grpc.StatusCode.OK
            assert worker.inputs == ["audio", "audio", "audio", "end"]

    run(controller, scenario)


def test_a_full_worker_refuses_resource_exhausted_and_a_gone_client_frees_its_slot(
    controller: Controller,
) -> None:
    async def scenario(stub: Any) -> None:
        async with ScriptedWorker(controller.address, "w-full", slots=1) as worker:
            first = ClientSession(stub, open_message())
            await first.read()
            second = ClientSession(stub, open_message())
            refused = await second.status()
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "session slot" in refused.details()
            first.call.cancel()  # the client goes away
            for _ in range(100):
                if worker.stops:
                    break
                await asyncio.sleep(0.05)
            assert worker.stops == ["client_gone"], worker.inputs
            third = ClientSession(stub, open_message())
            for _ in range(50):  # the slot frees once the worker's stream ends
                try:
                    assert (await third.read()).ready.session_id
                    break
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.05)
                    third = ClientSession(stub, open_message())
            third.send(END)
            assert (await third.read()).closed.reason == "ended"

    run(controller, scenario)


def test_the_worker_lost_ends_its_session_unavailable(controller: Controller) -> None:
    async def scenario(stub: Any) -> None:
        worker = await ScriptedWorker(controller.address, "w-lost", slots=1).__aenter__()
        session = ClientSession(stub, open_message())
        await session.read()
        session.send(audio(1))
        assert (await session.read()).chunk.sequence == 1
        await worker.lose()
        lost = await session.status()
        assert lost.code() == grpc.StatusCode.UNAVAILABLE
        assert "w-lost" in lost.details()

    run(controller, scenario)


def test_no_input_for_the_idle_timeout_closes_the_session(controller: Controller) -> None:
    async def scenario(stub: Any) -> None:
        async with ScriptedWorker(controller.address, "w-idle", slots=1) as worker:
            session = ClientSession(stub, open_message(idle_timeout_ms=400))
            await session.read()
            closed = (await session.read()).closed
            assert closed.reason == "idle_timeout"
            assert worker.stops == ["idle_timeout"]

    run(controller, scenario)


def test_a_bad_message_ends_that_session_alone(controller: Controller) -> None:
    async def scenario(stub: Any) -> None:
        async with ScriptedWorker(controller.address, "w-two", slots=2):
            good, bad = ClientSession(stub, open_message()), ClientSession(stub, open_message())
            await good.read()
            await bad.read()
            bad.send(rt.SessionRequest(audio=rt.AudioChunk(data=b"\0" * ((1 << 20) + 2))))
            refused = await bad.status()
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and field_of(refused) == "audio.data"
            good.send(audio(5), END)
            assert (await good.read()).chunk.audio[:1] == b"\x05"
            assert (await good.read()).closed.reason == "ended"

    run(controller, scenario)


@pytest.mark.parametrize(
    ("first", "code", "field"),
    [
        (rt.SessionRequest(audio=rt.AudioChunk(data=b"\0\0")), grpc.StatusCode.INVALID_ARGUMENT, "open"),
        (open_message(model="no-such-model"), grpc.StatusCode.NOT_FOUND, "model"),
        (open_message(model="tiny-sd"), grpc.StatusCode.FAILED_PRECONDITION, "model"),
        (open_message(video_encoding="h264"), grpc.StatusCode.INVALID_ARGUMENT, "video_encoding"),
        (open_message(audio_format="mp3"), grpc.StatusCode.INVALID_ARGUMENT, "audio_format"),
        (open_message(fps=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "fps"),
        (open_message(idle_timeout_ms=10**9), grpc.StatusCode.INVALID_ARGUMENT, "idle_timeout_ms"),
        (
            open_message(
                inputs=[types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_IMAGE, uri="http://x/y.png")]
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "inputs.uri",
        ),
        (
            open_message(inputs=[types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_MASK, data=b"x")]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "inputs",
        ),
        (open_message(labels={"k": "v" * 1000}), grpc.StatusCode.INVALID_ARGUMENT, "labels.k"),
    ],
)
def test_a_bad_open_is_refused_naming_the_field(
    controller: Controller, first: rt.SessionRequest, code: grpc.StatusCode, field: str
) -> None:
    async def scenario(stub: Any) -> None:
        refused = await ClientSession(stub, first).status()
        assert refused.code() == code, refused.details()
        assert field_of(refused) == field, refused.details()

    run(controller, scenario)


def test_without_a_hosting_worker_a_session_is_unavailable(controller: Controller) -> None:
    async def scenario(stub: Any) -> None:
        refused = await ClientSession(stub, open_message()).status()
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
        assert "no connected worker hosts sessions of tiny-talking-head" in refused.details()

    run(controller, scenario)


def test_a_streaming_model_refuses_jobs_naming_the_model(controller: Controller) -> None:
    from omnirt import types as t
    from omnirt.errors import FailedPrecondition

    with controller.client() as client, pytest.raises(FailedPrecondition) as refused:
        client.submit(t.GenerateRequest(task=t.Task.AUDIO2VIDEO, model=MODEL))
    assert refused.value.field == "model" and "realtime sessions" in refused.value.message


# ---- WS /v1/avatar/realtime: the original OmniRT's protocol, with a plain WebSocket client ----


def ws_run(controller: Controller, scenario: Callable[[Any], Awaitable[None]]) -> None:
    import aiohttp

    async def go() -> None:
        async with aiohttp.ClientSession() as http:
            await scenario(http)

    asyncio.run(go())


CREATE = {"type": "session.create", "model": MODEL, "inputs": {"image_b64": "cG5n"}, "config": {"seed": 9}}


def test_the_websocket_speaks_the_original_protocol(controller: Controller) -> None:
    import struct

    async def scenario(http: Any) -> None:
        async with ScriptedWorker(controller.address, "w-ws", slots=1) as worker:
            ws = await http.ws_connect(f"{controller.http}/v1/avatar/realtime")
            await ws.send_json(CREATE)
            created = await ws.receive_json(timeout=20)
            assert created["type"] == "session.created" and created["session_id"].startswith("sess-")
            assert created["audio"] == {
                "format": "pcm_s16le", "sample_rate": 16000, "channels": 1, "chunk_samples": CHUNK,
            }  # fmt: skip
            assert created["video"]["encoding"] == "jpeg-seq" and created["video"]["wire_magic"] == "VIDX"
            assert (created["video"]["fps"], created["video"]["width"]) == (25, 64)
            await ws.send_json({"type": "ping"})
            assert (await ws.receive_json(timeout=20)) == {"type": "pong"}
            await ws.send_bytes(b"AUDI" + b"\x07" * (2 * CHUNK))
            metrics = await ws.receive_json(timeout=20)
            assert metrics["type"] == "metrics" and metrics["chunk_index"] == 1
            video = await ws.receive_bytes(timeout=20)
            assert video[:4] == b"VIDX" and struct.unpack("<I", video[4:8]) == (28,)
            assert struct.unpack("<I", video[8:12]) == (4,) and video[12:16] == b"jpeg"
            await ws.send_json({"type": "session.cancel"})
            await ws.send_json({"type": "session.close"})
            cancelled = await ws.receive_json(timeout=20)
            assert cancelled == {"type": "session.cancelled", "session_id": created["session_id"]}
            closed = await ws.receive_json(timeout=20)
            assert closed["type"] == "session.closed" and closed["reason"] == "ended"
            assert closed["session_id"] == created["session_id"]
            assert (await ws.receive(timeout=20)).type.name == "CLOSE" and ws.close_code == 1000
            assert worker.inputs == ["audio", "interrupt", "end"]

    ws_run(controller, scenario)


@pytest.mark.parametrize(
    ("first", "code", "field", "close"),
    [
        ({**CREATE, "model": "no-such-model"}, "NOT_FOUND", "model", 1008),
        ({**CREATE, "type": "init"}, "INVALID_ARGUMENT", "type", 1008),
        ({**CREATE, "inputs": {"image_b64": "%%%"}}, "INVALID_ARGUMENT", "inputs.image_b64", 1008),
        ({**CREATE, "config": {"fps": "fast"}}, "INVALID_ARGUMENT", "config.fps", 1008),
        (CREATE, "UNAVAILABLE", "", 1013),  # no worker hosts sessions now
    ],
)
def test_a_bad_websocket_session_gets_a_json_error_and_a_close_code(
    controller: Controller, first: dict[str, Any], code: str, field: str, close: int
) -> None:
    async def scenario(http: Any) -> None:
        ws = await http.ws_connect(f"{controller.http}/v1/avatar/realtime")
        await ws.send_json(first)
        error = await ws.receive_json(timeout=20)
        assert (error["type"], error["code"], error["field"]) == ("error", code, field), error
        assert (await ws.receive(timeout=20)).type.name == "CLOSE" and ws.close_code == close

    ws_run(controller, scenario)


def test_a_binary_message_without_the_audio_magic_ends_the_session_1008(controller: Controller) -> None:
    async def scenario(http: Any) -> None:
        async with ScriptedWorker(controller.address, "w-ws-bad", slots=1) as worker:
            ws = await http.ws_connect(f"{controller.http}/v1/avatar/realtime")
            await ws.send_json(CREATE)
            assert (await ws.receive_json(timeout=20))["type"] == "session.created"
            await ws.send_bytes(b"RIFF....")
            error = await ws.receive_json(timeout=20)
            assert (error["code"], error["field"]) == ("INVALID_ARGUMENT", "audio")
            assert (await ws.receive(timeout=20)).type.name == "CLOSE" and ws.close_code == 1008
            for _ in range(100):
                if worker.stops:
                    break
                await asyncio.sleep(0.05)
            assert worker.stops == ["invalid_input"]

    ws_run(controller, scenario)


def test_the_python_sdk_opens_a_session_streams_and_reads_the_close(controller: Controller) -> None:
    def client_side() -> tuple[list[int], str, str]:
        with controller.client() as client:
            session = client.open_session(MODEL, image=b"png", config={"seed": 3})
            with session:
                session.send_audio(bytes([9]) * (2 * CHUNK))
                session.send_audio(bytes([8]) * (2 * CHUNK))
                session.end()
                sequences = [chunk.sequence for chunk in session]
                assert session.closed is not None
                return sequences, session.closed.reason, session.session_id

    async def scenario(_: Any) -> None:
        async with ScriptedWorker(controller.address, "w-sdk", slots=1):
            sequences, reason, session_id = await asyncio.to_thread(client_side)
            assert sequences == [1, 2] and reason == "ended" and session_id.startswith("sess-")

    run(controller, scenario)


def test_the_python_sdk_raises_the_typed_error_of_a_refused_session(controller: Controller) -> None:
    from omnirt.errors import FailedPrecondition

    with controller.client() as client, pytest.raises(FailedPrecondition) as refused:
        client.open_session("tiny-sd", image=b"png")
    assert refused.value.field == "model"


def test_sessions_show_in_the_metrics(controller: Controller) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{controller.http}/metrics", timeout=10) as response:
        text = response.read().decode()
    opened = re.search(
        r'^omnirt_sessions_total\{model="tiny-talking-head",outcome="opened"\} (\S+)$', text, re.M
    )
    ended = re.search(
        r'^omnirt_sessions_total\{model="tiny-talking-head",outcome="ended"\} (\S+)$', text, re.M
    )
    chunks = re.search(r'^omnirt_session_chunks_total\{model="tiny-talking-head"\} (\S+)$', text, re.M)
    assert opened and ended and chunks, "the tests above opened, ended and streamed sessions"
    assert float(opened.group(1)) >= float(ended.group(1)) >= 1 and float(chunks.group(1)) >= 3
    assert re.search(r'^omnirt_sessions_active\{model="tiny-talking-head"\} 0\.0$', text, re.M)


def test_a_session_continues_the_callers_trace_to_the_worker(controller: Controller) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traceparent = f"00-{trace_id}-00f067aa0ba902b7-01"

    async def scenario(stub: Any) -> None:
        async with ScriptedWorker(controller.address, "w-trace", slots=1) as worker:
            session = ClientSession(stub, open_message(), metadata=(("traceparent", traceparent),))
            assert (await session.read()).ready.trace_id == trace_id
            (offered,) = worker.trace_contexts
            assert offered["traceparent"].split("-")[1] == trace_id, offered
            assert offered["traceparent"] != traceparent, "the session's own span, a child of the caller's"
            session.send(END)
            assert (await session.read()).closed.reason == "ended"

    run(controller, scenario)


def test_with_keys_a_session_needs_one_on_grpc_and_on_the_websocket(log_dir: Path) -> None:
    import aiohttp

    from omnirt.controller.edges.auth import key_digest

    key = "sk-session-tenant-alice"
    keys = log_dir / "session-keys.toml"
    keys.write_text(f'[[keys]]\ntenant = "alice"\nrole = "user"\nsha256 = "{key_digest(key)}"\n')
    secured = Controller(log_dir, "--auth-keys", str(keys), http=True).start()
    try:

        async def scenario() -> None:
            async with grpc.aio.insecure_channel(secured.address) as channel:
                stub = realtime_pb2_grpc.RealtimeServiceStub(channel)
                # Refused at the call's start: nothing is written, so the client's first write
                # cannot race the refusal (gRPC's client then reports its failed send, INTERNAL
                # "Internal error from Core", instead of the server's status: seen once in CI).
                unkeyed = stub.Session()
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async with asyncio.timeout(20):
                        await unkeyed.read()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
                keyed = ClientSession(stub, open_message(), metadata=(("authorization", f"Bearer {key}"),))
                assert (await keyed.status()).code() == grpc.StatusCode.UNAVAILABLE  # in, no worker
            async with aiohttp.ClientSession() as http:
                with pytest.raises(aiohttp.WSServerHandshakeError) as handshake:
                    await http.ws_connect(f"{secured.http}/v1/avatar/realtime")
                assert handshake.value.status == 401
                headers = {"Authorization": f"Bearer {key}"}
                async with http.ws_connect(f"{secured.http}/v1/avatar/realtime", headers=headers) as ws:
                    await ws.send_json(CREATE)
                    assert (await ws.receive_json(timeout=20))["code"] == "UNAVAILABLE"

        asyncio.run(scenario())
    finally:
        secured.stop()


def test_the_async_sdk_streams_a_session_too(controller: Controller) -> None:
    from omnirt import AsyncClient

    async def scenario(_: Any) -> None:
        async with ScriptedWorker(controller.address, "w-async", slots=1) as worker:
            async with AsyncClient(controller.address) as client:
                session = await client.open_session(MODEL, image=b"png", config={"seed": 2}, fps=25.0)
                async with session:
                    await session.send_audio(bytes([4]) * (2 * CHUNK))
                    await session.interrupt()
                    await session.end()
                    sequences = [chunk.sequence async for chunk in session]
                assert sequences == [1] and session.closed is not None and session.closed.reason == "ended"
            assert worker.inputs == ["audio", "interrupt", "end"]

    run(controller, scenario)
