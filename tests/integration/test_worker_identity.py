"""Worker ids: a live worker's id is not taken over by another process, a worker reconnecting
while the controller still holds its old stream gets back in at once, and a worker whose
`--models` names a model the catalog lacks is told so (its log, `ListWorkers`, `omnirtctl`).

Real controllers (memory and Redis stores), real `null` workers, a real `redis-server`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

import omnirt
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.types import EventKind, JobState
from tests.daemons import Controller, RedisServer, Worker, free_port, job_store, wait_for

# About 5 s of steps.
SLOW_NULL = {"model": "null", "num_inference_steps": 100, "extra": {"sleep_ms_per_step": 50}}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest, log_dir: Path) -> Iterator[tuple[str, ...]]:
    with job_store(request.param, log_dir) as flags:
        yield flags


def null_worker(log_dir: Path, address: str, worker_id: str, model_dir: Path, log_name: str) -> Worker:
    worker = Worker(log_dir, address, worker_id, model_dir, "--models", "null", "--reconnect-max-s", "0.5")
    worker.log_path = log_dir / f"{log_name}.log"  # two processes with one id: one log each
    return worker.start()


def pids(controller: Controller, worker_id: str) -> list[int]:
    return [w.pid for w in controller.workers() if w.id == worker_id]


def wait_running(client: omnirt.Client, job_id: str) -> None:
    for event in client.watch(job_id, timeout=60):
        if event.kind is EventKind.PROGRESS:
            return


def test_a_second_process_with_a_live_workers_id_is_refused_until_the_first_is_gone(
    store: tuple[str, ...], log_dir: Path, model_dir: Path
) -> None:
    controller = Controller(log_dir, *store, "--lease-timeout-ms", "3000").start()
    first = null_worker(log_dir, controller.address, "w-twin", model_dir, f"w-twin-first-{controller.port}")
    second: Worker | None = None
    try:
        controller.wait_worker("w-twin")
        with omnirt.Client(controller.address, timeout=10) as client:
            job = client.submit(prompt="keeps its worker", **SLOW_NULL)
            wait_running(client, job.id)
            second = null_worker(
                log_dir, controller.address, "w-twin", model_dir, f"w-twin-second-{controller.port}"
            )
            wait_for(lambda: "ALREADY_EXISTS" in second.log(), 60, "the second process to be refused")
            refusal = next(line for line in second.log().splitlines() if "ALREADY_EXISTS" in line)
            assert "w-twin" in refusal and "already connected" in refusal
            assert pids(controller, "w-twin") == [first.pid], "the live worker keeps its id"
            client.wait(job.id, timeout=60)
            final = client.get_job(job.id)
            assert final.state is JobState.SUCCEEDED and final.attempts == 1, final
            assert pids(controller, "w-twin") == [first.pid]
            assert first.stop() == 0
            # The first one is gone: the second gets in and serves.
            wait_for(lambda: pids(controller, "w-twin") == [second.pid], 30, "the second process")
            after = client.generate(model="null", prompt="next", num_inference_steps=2, timeout=30)
            assert after.report.worker_id == "w-twin"
            jobs = client.list_jobs(states=[JobState.RUNNING])
            assert jobs == [], "no job is left RUNNING"
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()
        controller.stop()


def test_on_redis_a_live_workers_id_is_refused_on_another_controller_too(
    log_dir: Path, model_dir: Path
) -> None:
    server = RedisServer(log_dir).start()
    store = ("--store", server.url, "--lease-timeout-ms", "3000")
    first_ctl, second_ctl = Controller(log_dir, *store).start(), Controller(log_dir, *store).start()
    first = null_worker(log_dir, first_ctl.address, "w-shared", model_dir, f"w-shared-first-{server.port}")
    second: Worker | None = None
    try:
        first_ctl.wait_worker("w-shared")
        second = null_worker(
            log_dir, second_ctl.address, "w-shared", model_dir, f"w-shared-second-{server.port}"
        )
        wait_for(lambda: "ALREADY_EXISTS" in second.log(), 60, "the second process to be refused")
        assert pids(second_ctl, "w-shared") == [first.pid], "the cluster view keeps the live one"
        assert first.stop() == 0
        wait_for(lambda: pids(second_ctl, "w-shared") == [second.pid], 30, "the second process")
        with omnirt.Client(second_ctl.address, timeout=10) as client:
            after = client.generate(model="null", prompt="next", num_inference_steps=2, timeout=30)
            assert after.report.worker_id == "w-shared"
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()
        first_ctl.stop()
        second_ctl.stop()
        server.stop()


class HalfDeadProxy:
    """A TCP proxy whose `cut()` drops the worker's side of every connection and keeps the
    controller's side open and silent: the controller still holds a stream no one reads."""

    def __init__(self, upstream_port: int) -> None:
        self.port = free_port()
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._clients: list[socket.socket] = []
        self._upstreams: list[socket.socket] = []
        self._cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._clients.append(client)
            self._upstreams.append(upstream)
            cut = self._cut
            threading.Thread(target=self._pump, args=(client, upstream, cut), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, cut), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket, cut: threading.Event) -> None:
        while not cut.is_set():
            try:
                data = source.recv(65536)
                if not data or cut.is_set():
                    return
                target.sendall(data)
            except OSError:
                return

    def cut(self) -> None:
        self._cut.set()
        self._cut = threading.Event()  # connections made from now on are pumped again
        for client in self._clients:
            client.close()
        self._clients = []

    def close(self) -> None:
        self._listener.close()
        for sock in self._clients + self._upstreams:
            sock.close()


def test_a_worker_reconnecting_while_its_old_stream_looks_alive_gets_back_in_and_keeps_its_job(
    store: tuple[str, ...], log_dir: Path, model_dir: Path
) -> None:
    # A long lease: the old stream stays "alive" to the controller for the whole test.
    controller = Controller(log_dir, *store, "--lease-timeout-ms", "60000").start()
    proxy = HalfDeadProxy(controller.port)
    worker = null_worker(
        log_dir, f"127.0.0.1:{proxy.port}", "w-flaky", model_dir, f"w-flaky-{controller.port}"
    )
    try:
        controller.wait_worker("w-flaky")
        connected = [w.connected_at.ToMilliseconds() for w in controller.workers() if w.id == "w-flaky"]
        with omnirt.Client(controller.address, timeout=10) as client:
            job = client.submit(prompt="survives a reconnect", **SLOW_NULL)
            wait_running(client, job.id)
            proxy.cut()
            wait_for(
                lambda: (
                    [w.connected_at.ToMilliseconds() for w in controller.workers() if w.id == "w-flaky"]
                    not in ([], connected)
                ),
                30,
                "the worker to be back on a new stream",
            )
            assert "ALREADY_EXISTS" not in worker.log()
            client.wait(job.id, timeout=60)
            final = client.get_job(job.id)
            assert final.state is JobState.SUCCEEDED and final.attempts == 1, final
            wait_for(lambda: sum(w.busy_slots for w in controller.workers()) == 0, 10, "a free slot")
    finally:
        worker.stop()
        proxy.close()
        controller.stop()


def test_a_worker_serving_a_model_the_catalog_lacks_is_warned_and_listed(
    log_dir: Path, model_dir: Path
) -> None:
    controller = Controller(log_dir).start()
    worker = Worker(
        log_dir, controller.address, "w-typo", model_dir, "--models", "null,nul-typo", "--no-preload"
    ).start()
    try:
        controller.wait_worker("w-typo")
        info = next(w for w in controller.workers() if w.id == "w-typo")
        assert list(info.unknown_models) == ["nul-typo"]
        wait_for(
            lambda: any("WARNING" in line and "nul-typo" in line for line in worker.log().splitlines()),
            10,
            "the worker to log the controller's warning",
        )
        cli = [sys.executable, "-m", "omnirt.cli.main", "--controller", controller.address, "workers", "list"]
        shown = subprocess.run(cli, capture_output=True, text=True, timeout=30, check=True).stdout
        assert "nul-typo!" in shown
        as_json = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=30, check=True)
        assert json.loads(as_json.stdout)[0]["unknown_models"] == ["nul-typo"]
    finally:
        worker.stop()
        controller.stop()


class HandStream:
    """A worker stream driven by hand: it sends its Hello and nothing more until closed."""

    def __init__(self, address: str, worker_id: str, instance_id: str) -> None:
        self.channel = grpc.insecure_channel(address)
        self._done = threading.Event()
        hello = pb.Hello(
            worker_id=worker_id,
            execution_mode="legacy_call",
            backend="cpu",
            models=["null"],
            slots=1,
            instance_id=instance_id,
            reports_running=True,
        )

        def requests() -> Iterator[pb.ConnectRequest]:
            yield pb.ConnectRequest(hello=hello)
            self._done.wait()

        self.stream = gateway_pb2_grpc.WorkerGatewayServiceStub(self.channel).Connect(requests(), timeout=120)

    def first(self) -> str:
        """What the controller answered the Hello with: 'welcome', or the status code's name."""
        try:
            return next(self.stream).WhichOneof("message") or "?"
        except grpc.RpcError as exc:
            return str(exc.code().name)

    def end(self) -> str:
        """Read until the controller ends the stream: 'OK', or the status code's name."""
        try:
            for _ in self.stream:
                pass
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return "OK"

    def close(self) -> None:
        self._done.set()
        self.channel.close()


def race_hellos(addresses: list[str], worker_id: str) -> tuple[list[str], list[HandStream]]:
    """One Hello with `worker_id` to each address at the same instant, each from its own process
    (instance id); the answers, in the order of `addresses`."""
    barrier = threading.Barrier(len(addresses))
    answers = [""] * len(addresses)
    streams: list[HandStream | None] = [None] * len(addresses)

    def hello(i: int) -> None:
        barrier.wait()
        streams[i] = HandStream(addresses[i], worker_id, f"{worker_id}-process-{i}")
        answers[i] = streams[i].first()  # type: ignore[union-attr]

    threads = [threading.Thread(target=hello, args=(i,)) for i in range(len(addresses))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return answers, [s for s in streams if s is not None]


def test_on_redis_two_processes_racing_for_one_id_on_two_controllers_let_exactly_one_in(
    log_dir: Path,
) -> None:
    server = RedisServer(log_dir).start()
    store = ("--store", server.url, "--lease-timeout-ms", "5000")
    controllers = [Controller(log_dir, *store).start(), Controller(log_dir, *store).start()]
    try:
        for round_ in range(8):
            worker_id = f"w-race-{round_}"
            answers, streams = race_hellos([c.address for c in controllers], worker_id)
            assert sorted(answers) == ["ALREADY_EXISTS", "welcome"], (round_, answers)
            winner = controllers[answers.index("welcome")]
            assert [w.instance_id for w in winner.workers() if w.id == worker_id] == [
                f"{worker_id}-process-{answers.index('welcome')}"
            ]
            for stream in streams:
                stream.close()
            # The winner's stream ended: its claim is released at once, the id is free again.
            loser = controllers[answers.index("ALREADY_EXISTS")]
            wait_for(lambda: worker_id not in loser.worker_ids(), 30, "the winner to be gone")  # noqa: B023
            again = HandStream(loser.address, worker_id, "a-third-process")
            try:
                assert again.first() == "welcome"
            finally:
                again.close()
    finally:
        for controller in controllers:
            controller.stop()
        server.stop()


def test_on_redis_a_controller_whose_worker_lost_its_id_claim_disconnects_it(log_dir: Path) -> None:
    # As when the claim expired while Redis was away (or Redis restarted empty) and another
    # process of that id got in through another controller first.
    server = RedisServer(log_dir).start()
    controller = Controller(log_dir, "--store", server.url, "--lease-timeout-ms", "5000").start()
    stream = HandStream(controller.address, "w-claimed", "first-process")
    try:
        assert stream.first() == "welcome"
        controller.wait_worker("w-claimed")
        store = redis.Redis.from_url(server.url)
        store.hset("{omnirt}:worker-claim:w-claimed", mapping={"instance": "other", "owner": "ctl-x"})
        assert stream.end() == "OK", "the controller ends the stream of the worker that lost its id"
        again = HandStream(controller.address, "w-claimed", "first-process")
        try:
            assert again.first() == "ALREADY_EXISTS", "the other process holds the id now"
        finally:
            again.close()
        store.delete("{omnirt}:worker-claim:w-claimed")  # the other one is gone
        back = HandStream(controller.address, "w-claimed", "first-process")
        try:
            assert back.first() == "welcome"
        finally:
            back.close()
    finally:
        stream.close()
        controller.stop()
        server.stop()
