"""Realtime sessions hosted by a real worker process, with this test as the controller.

The test serves `WorkerGatewayService` itself: Connect answers Welcome and then the session
offers the test queues; the worker dials WorkerSession for each, and the test plays the
controller's side of that stream (relaying a client's audio, interrupt, end, stop). The model is
the tiny talking head (`builtin:tiny-talking-head`, ~0.4 s of CPU per 1.12 s chunk).
"""

from __future__ import annotations

import contextlib
import io
import queue
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2
from PIL import Image

from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.v1 import models_pb2, realtime_pb2, types_pb2
from tests.daemons import Worker, wait_for

CHUNK, RATE, FRAMES, SIZE = 17920, 16000, 28, 64
TIMEOUT = 120.0  # the first session builds and loads the model


def speech(seed: int, samples: int = CHUNK) -> np.ndarray:
    """Voice-like int16 PCM: a few harmonics of a wandering pitch under a syllable envelope."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / RATE
    phase = 2 * np.pi * np.cumsum(rng.uniform(100, 220) * (1 + 0.1 * np.sin(2 * np.pi * t))) / RATE
    envelope = np.clip(np.sin(2 * np.pi * 4 * t + rng.uniform(0, np.pi)), 0, None)
    signal = 0.3 * sum(np.sin(k * phase) / k for k in range(1, 5)) * envelope
    return np.round(signal * 32767).astype(np.int16)


def portrait_png() -> bytes:
    """An 80x96 face-ish PNG: a skin ellipse with dark eyes and mouth."""
    y, x = np.mgrid[0:96, 0:80]
    image = np.full((96, 80, 3), 60.0)
    image[((x - 40) / 28) ** 2 + ((y - 48) / 38) ** 2 < 1] = (220, 180, 150)
    for cx, cy, rx, ry in ((28, 38, 5, 3), (52, 38, 5, 3), (40, 68, 12, 4)):
        image[((x - cx) / rx) ** 2 + ((y - cy) / ry) ** 2 < 1] = 30
    out = io.BytesIO()
    Image.fromarray(image.astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


TALKING_HEAD = models_pb2.ModelSpec(
    id="tiny-talking-head",
    execution_mode="legacy_call",
    source="builtin:tiny-talking-head",
    pipeline_class="TalkingHeadPipeline",
    streaming=True,
)


class Peer:
    """The controller's side of one WorkerSession stream."""

    def __init__(self, attach: pb.SessionAttach) -> None:
        self.attach = attach
        self.inbox: queue.Queue[pb.WorkerSessionRequest | None] = queue.Queue()
        self.outbox: queue.Queue[pb.WorkerSessionResponse] = queue.Queue()
        self.done = threading.Event()
        self.broken = threading.Event()  # the test breaks the stream (a controller gone)

    def read(self, timeout: float = TIMEOUT) -> pb.WorkerSessionRequest | None:
        """The worker's next message; None once it closed the stream."""
        return self.inbox.get(timeout=timeout)

    def audio(self, pcm: np.ndarray | bytes, sequence: int = 0) -> None:
        data = pcm if isinstance(pcm, bytes) else pcm.astype("<i2").tobytes()
        self._input(realtime_pb2.SessionRequest(audio=realtime_pb2.AudioChunk(sequence=sequence, data=data)))

    def interrupt(self) -> None:
        self._input(realtime_pb2.SessionRequest(interrupt=realtime_pb2.Interrupt()))

    def end(self) -> None:
        self._input(realtime_pb2.SessionRequest(end=realtime_pb2.EndInput()))

    def text(self, text: str) -> None:
        self._input(realtime_pb2.SessionRequest(text=realtime_pb2.TextInput(text=text)))

    def stop(self, reason: str) -> None:
        self.outbox.put(pb.WorkerSessionResponse(stop=reason))

    def break_stream(self) -> None:
        self.broken.set()

    def _input(self, request: realtime_pb2.SessionRequest) -> None:
        self.outbox.put(pb.WorkerSessionResponse(input=request))

    def ready(self) -> realtime_pb2.SessionReady:
        message = self.read()
        assert message is not None and message.WhichOneof("message") == "ready", message
        return message.ready

    def rest(self) -> list[pb.WorkerSessionRequest]:
        """Every message up to the end of the stream."""
        out = []
        while (message := self.read()) is not None:
            out.append(message)
        return out


class Gateway(gateway_pb2_grpc.WorkerGatewayServiceServicer):
    """Connect: Welcome, then the offers the test queues; WorkerSession: a `Peer` per attach."""

    def __init__(self) -> None:
        self.hellos: queue.Queue[pb.Hello] = queue.Queue()
        self.heartbeats: queue.Queue[pb.Heartbeat] = queue.Queue()
        self.offers: queue.Queue[pb.ConnectResponse] = queue.Queue()
        self.peers: dict[str, queue.Queue[Peer]] = {}
        self.hello = pb.Hello()
        self._lock = threading.Lock()

    def _peers(self, session_id: str) -> queue.Queue[Peer]:
        with self._lock:
            return self.peers.setdefault(session_id, queue.Queue())

    def Connect(
        self, request_iterator: Iterator[pb.ConnectRequest], context: Any
    ) -> Iterator[pb.ConnectResponse]:
        hello = next(request_iterator).hello
        self.hellos.put(hello)
        half_closed = threading.Event()

        def read() -> None:
            for message in request_iterator:
                if message.WhichOneof("message") == "heartbeat":
                    self.heartbeats.put(message.heartbeat)
            half_closed.set()

        threading.Thread(target=read, daemon=True).start()
        yield pb.ConnectResponse(
            welcome=pb.Welcome(worker_id=hello.worker_id, heartbeat_interval_ms=300, lease_timeout_ms=5000)
        )
        while context.is_active() and not half_closed.is_set():
            try:
                yield self.offers.get(timeout=0.05)
            except queue.Empty:
                continue

    def WorkerSession(
        self, request_iterator: Iterator[pb.WorkerSessionRequest], context: Any
    ) -> Iterator[pb.WorkerSessionResponse]:
        first = next(request_iterator)
        assert first.WhichOneof("message") == "attach", first
        peer = Peer(first.attach)

        def pump() -> None:
            try:
                for message in request_iterator:
                    peer.inbox.put(message)
            except grpc.RpcError:
                pass
            finally:
                peer.inbox.put(None)
                peer.done.set()

        threading.Thread(target=pump, daemon=True).start()
        self._peers(first.attach.session_id).put(peer)
        while not peer.done.is_set() and context.is_active():  # ends (OK) once the worker half-closes
            if peer.broken.is_set():
                context.abort(grpc.StatusCode.UNAVAILABLE, "the controller went away")
            try:
                yield peer.outbox.get(timeout=0.05)
            except queue.Empty:
                continue

    def offer(
        self,
        *,
        model: models_pb2.ModelSpec = TALKING_HEAD,
        image: bytes | None = None,
        config: dict[str, Any] | None = None,
        deadline_ms: int = 0,
        **open_fields: Any,
    ) -> Peer:
        """Offer a session and return its stream once the worker attached."""
        session_id = f"s-{uuid.uuid4().hex[:8]}"
        opened = realtime_pb2.SessionOpen(model=model.id, **open_fields)
        if image is None:
            image = portrait_png()
        if image:
            opened.inputs.append(types_pb2.MediaInput(role=types_pb2.MEDIA_ROLE_IMAGE, data=image))
        if config:
            opened.config.CopyFrom(struct_pb2.Struct())
            opened.config.update(config)
        offer = pb.SessionOffer(session_id=session_id, model=model, open=opened, deadline_ms=deadline_ms)
        self.offers.put(pb.ConnectResponse(session_offer=offer))
        peer = self._peers(session_id).get(timeout=TIMEOUT)
        assert (
            peer.attach.worker_id == self.hello.worker_id
            and peer.attach.instance_id == self.hello.instance_id
        )
        return peer


@contextlib.contextmanager
def hosted(log_dir: Path, models: Path, name: str, *flags: str) -> Iterator[tuple[Gateway, Worker]]:
    """A `Gateway` on a free port and a worker process connected to it."""
    servicer = Gateway()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=12))
    gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    worker = Worker(log_dir, f"127.0.0.1:{port}", name, models, *flags)
    worker.start()
    try:
        servicer.hello = servicer.hellos.get(timeout=TIMEOUT)
        yield servicer, worker
    finally:
        worker.stop()
        server.stop(0)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("session-models")


@pytest.fixture(scope="module")
def gateway(log_dir: Path, models: Path) -> Iterator[Gateway]:
    with hosted(log_dir, models, "w-sessions", "--session-slots", "2") as (servicer, _):
        assert servicer.hello.session_slots == 2
        yield servicer


def kinds(messages: list[pb.WorkerSessionRequest]) -> list[str]:
    return [m.WhichOneof("message") or "" for m in messages]


def chunks(messages: list[pb.WorkerSessionRequest]) -> list[realtime_pb2.OutputChunk]:
    return [m.chunk for m in messages if m.WhichOneof("message") == "chunk"]


def last(messages: list[pb.WorkerSessionRequest]) -> pb.WorkerSessionRequest:
    assert messages, "the worker closed the stream without a last message"
    return messages[-1]


def test_audio_streams_back_as_frames_in_order_and_the_partial_last_chunk_is_padded(gateway: Gateway) -> None:
    peer = gateway.offer(config={"seed": 7})
    ready = peer.ready()
    assert (ready.chunk_samples, ready.sample_rate, ready.channels) == (CHUNK, RATE, 1)
    assert (ready.audio_format, ready.video_encoding) == ("pcm_s16le", "jpeg")
    assert (ready.width, ready.height, ready.fps, ready.frames_per_chunk) == (SIZE, SIZE, 25.0, FRAMES)
    assert ready.max_buffered_samples == 4 * CHUNK and ready.model == "tiny-talking-head"
    audio = np.concatenate([speech(1), speech(2), speech(3, CHUNK // 2)])
    # Sent in pieces that do not line up with the chunks, numbered.
    pieces = np.array_split(audio, 5)
    for sequence, piece in enumerate(pieces, start=1):
        peer.audio(piece, sequence=sequence)
    peer.end()
    messages = peer.rest()
    assert last(messages).WhichOneof("message") == "closed", last(messages)
    out = chunks(messages)
    assert [c.sequence for c in out] == [1, 2, 3]
    assert [c.pts_ms for c in out] == [0.0, 1120.0, 2240.0]
    assert all(c.duration_ms == 1120.0 and c.sample_rate == RATE for c in out)
    padded = np.concatenate([audio, np.zeros(CHUNK // 2, np.int16)])
    for index, chunk in enumerate(out):
        assert np.array_equal(np.frombuffer(chunk.audio, "<i2"), padded[index * CHUNK : (index + 1) * CHUNK])
        assert len(chunk.frames) == FRAMES
        frame = Image.open(io.BytesIO(chunk.frames[0]))
        assert (frame.format, frame.size, frame.mode) == ("JPEG", (SIZE, SIZE), "RGB")
        assert chunk.latency_ms > 0
    progress = [m.progress for m in messages if m.WhichOneof("message") == "progress"]
    assert [p.chunks_out for p in progress] == [1, 2, 3]
    closed = last(messages).closed
    assert closed.reason == "ended"
    report = closed.report
    assert (report.chunks_in, report.chunks_out, report.worker_id) == (5, 3, "w-sessions")
    assert report.audio_ms == pytest.approx(2.5 * 1120)
    assert report.first_chunk_latency_ms > 0 and report.mean_chunk_latency_ms > 0
    assert report.real_time_factor > 0 and report.duration_ms > 0


def test_interrupt_drops_the_buffered_audio(gateway: Gateway) -> None:
    peer = gateway.offer()
    peer.ready()
    first, dropped, after = speech(4), np.concatenate([speech(5), speech(6)]), speech(7, CHUNK // 4)
    # One message of three chunks: the first goes into the model at once, two wait in the buffer
    # while it computes, and the interrupt right behind drops them.
    peer.audio(np.concatenate([first, dropped]))
    peer.interrupt()
    peer.audio(after)
    peer.end()
    messages = peer.rest()
    assert last(messages).closed.reason == "ended", last(messages)
    out = chunks(messages)
    assert [c.pts_ms for c in out] == [0.0, 1120.0]
    assert np.array_equal(np.frombuffer(out[0].audio, "<i2"), first)
    expected = np.concatenate([after, np.zeros(CHUNK - len(after), np.int16)])
    assert np.array_equal(np.frombuffer(out[1].audio, "<i2"), expected)


def test_a_fast_client_is_held_back_and_the_buffer_stays_bounded(gateway: Gateway) -> None:
    peer = gateway.offer()
    ready = peer.ready()
    sent = 7
    for index in range(sent):
        peer.audio(speech(10 + index))
    peer.end()
    messages = peer.rest()
    assert last(messages).closed.reason == "ended", last(messages)
    assert [c.sequence for c in chunks(messages)] == list(range(1, sent + 1))
    buffered = [m.progress.buffered_samples for m in messages if m.WhichOneof("message") == "progress"]
    # Unread, all six chunks behind the first would be buffered; reading stops at four.
    assert max(buffered) <= ready.max_buffered_samples


@pytest.mark.parametrize(
    ("offer", "feed", "code", "field"),
    [
        ({}, lambda p: p.audio(b"\x00\x01\x02"), "INVALID_ARGUMENT", "audio.data"),
        ({}, lambda p: p.audio(speech(1, 100), sequence=2), "INVALID_ARGUMENT", "audio.sequence"),
        ({}, lambda p: p.audio(np.zeros(4 * CHUNK + 2, np.int16)), "INVALID_ARGUMENT", "audio.data"),
        ({}, lambda p: p.text("hello"), "FAILED_PRECONDITION", "text"),
        ({"image": b"not an image"}, None, "INVALID_ARGUMENT", "reference_image"),
        ({"image": b""}, None, "INVALID_ARGUMENT", "inputs"),
        ({"config": {"steps": 2}}, None, "INVALID_ARGUMENT", "config.steps"),
        ({"config": {"seed": 1.5}}, None, "INVALID_ARGUMENT", "config.seed"),
        ({"width": 128}, None, "INVALID_ARGUMENT", "width"),
        ({"sample_rate": 44100}, None, "INVALID_ARGUMENT", "sample_rate"),
        ({"audio_format": "opus"}, None, "INVALID_ARGUMENT", "audio_format"),
        ({"video_encoding": "vp9"}, None, "INVALID_ARGUMENT", "video_encoding"),
        (
            {
                "model": models_pb2.ModelSpec(
                    id="tiny-sd", source="builtin:tiny-sd", pipeline_class="StableDiffusionPipeline"
                )
            },
            None,
            "FAILED_PRECONDITION",
            "model",
        ),
    ],
    ids=[
        "odd-bytes",
        "wrong-sequence",
        "oversized-message",
        "text",
        "undecodable-image",
        "no-image",
        "unknown-config",
        "fractional-seed",
        "width",
        "sample-rate",
        "audio-format",
        "video-encoding",
        "model-does-not-stream",
    ],
)
def test_bad_input_ends_the_session_with_the_field_and_the_worker_serves_on(
    gateway: Gateway, offer: dict[str, Any], feed: Any, code: str, field: str
) -> None:
    peer = gateway.offer(**offer)
    if feed is not None:
        peer.ready()
        feed(peer)
    messages = peer.rest()
    error = last(messages)
    assert error.WhichOneof("message") == "error", error
    assert (error.error.code, error.error.field) == (code, field), error.error.message
    assert not chunks(messages)


def test_the_worker_serves_a_good_session_after_bad_ones(gateway: Gateway) -> None:
    bad = gateway.offer(image=b"garbage")
    assert last(bad.rest()).error.field == "reference_image"
    peer = gateway.offer()
    peer.ready()
    peer.audio(speech(20))
    peer.end()
    messages = peer.rest()
    assert [c.sequence for c in chunks(messages)] == [1]
    assert last(messages).closed.reason == "ended"


def test_two_sessions_at_once_a_third_is_refused_and_stop_frees_a_slot(gateway: Gateway) -> None:
    one, two = gateway.offer(), gateway.offer()
    one.ready()
    two.ready()
    sessions = {one.attach.session_id, two.attach.session_id}
    with contextlib.suppress(queue.Empty):
        while True:  # the beats from before these sessions
            gateway.heartbeats.get_nowait()
    wait_for(
        lambda: sessions <= set(gateway.heartbeats.get(timeout=TIMEOUT).sessions),
        10,
        "a heartbeat listing both",
    )
    one.audio(speech(30))
    two.audio(speech(31))
    for peer in (one, two):
        message = peer.read()
        assert message is not None and message.chunk.sequence == 1, message

    third = gateway.offer()
    refused = last(third.rest())
    assert refused.error.code == "RESOURCE_EXHAUSTED", refused

    one.stop("cancelled")
    stopped = last(one.rest())
    assert stopped.closed.reason == "cancelled", stopped
    fourth = gateway.offer()
    fourth.ready()
    for peer in (two, fourth):
        peer.end()
        assert last(peer.rest()).closed.reason == "ended"


def test_a_session_past_its_deadline_closes_with_max_duration(gateway: Gateway) -> None:
    peer = gateway.offer(deadline_ms=int(time.time() * 1000) + 1500)
    peer.ready()
    started = time.monotonic()
    closed = last(peer.rest())
    assert closed.closed.reason == "max_duration", closed
    assert time.monotonic() - started < 10


def test_fmp4_output_is_one_playable_segment_per_chunk(gateway: Gateway) -> None:
    av = pytest.importorskip("av")
    peer = gateway.offer(video_encoding="fmp4")
    assert peer.ready().video_encoding == "fmp4"
    peer.audio(speech(40))
    peer.end()
    out = chunks(peer.rest())
    assert len(out) == 1 and not out[0].frames
    with av.open(io.BytesIO(out[0].segment)) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == FRAMES and decoded[0].shape == (SIZE, SIZE, 3)


def test_a_broken_stream_frees_the_slot(gateway: Gateway) -> None:
    one, two = gateway.offer(), gateway.offer()
    one.ready()
    two.ready()
    one.break_stream()
    assert one.rest() == []
    # The worker sees the break, closes the session and takes the next one in its slot.
    three = gateway.offer()
    message = three.read()
    for _ in range(20):  # the break may reach the worker just after this offer
        if message is None or message.WhichOneof("message") == "ready":
            break
        assert message.error.code == "RESOURCE_EXHAUSTED", message
        time.sleep(0.1)
        three = gateway.offer()
        message = three.read()
    assert message is not None and message.WhichOneof("message") == "ready", message
    for peer in (two, three):
        peer.end()
        assert last(peer.rest()).closed.reason == "ended"


def test_a_drain_lets_sessions_run_until_its_timeout_then_closes_them(log_dir: Path, models: Path) -> None:
    flags = ("--session-slots", "1", "--drain-timeout-s", "1")
    with hosted(log_dir, models, "w-drain", *flags) as (servicer, worker):
        peer = servicer.offer()
        peer.ready()
        worker.signal(signal.SIGTERM)
        peer.audio(speech(50))  # still served while the drain waits
        message = peer.read()
        assert message is not None and message.chunk.sequence == 1, message
        closed = last(peer.rest())
        assert closed.closed.reason == "worker_draining", closed
        assert worker.wait(30) == 0
