"""Workers must be admitted: a worker without the controller's token (or, with mTLS, without a
client certificate its CA signed) is refused at Hello, exits 2 and never receives a job; a
rogue claiming a live worker's id does not evict it; a rotated token is taken on SIGHUP, and a
worker re-reads its token file when it reconnects. Over TLS a worker verifies the controller.

Real controllers and real `null` workers; certificates made here (tests/certs.py).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import omnirt
from omnirt._internal.protocol.v1 import gateway_pb2 as pb
from omnirt._internal.protocol.v1 import gateway_pb2_grpc
from omnirt.testing import Daemon
from omnirt.types import EventKind, JobState
from omnirt.v1 import cluster_pb2, cluster_pb2_grpc
from tests.certs import Issued, make_ca, make_cert
from tests.daemons import Controller, Worker, free_port, wait_for
from tests.integration.test_worker_identity import HalfDeadProxy

TOKEN = "wt-old-3f9a1c0d5e7b2a4f6c8e0d1b3a5c7e9f"
NEW_TOKEN = "wt-new-8b6d4f2a0c1e3b5d7f9a2c4e6b8d0f1a"
# A second null model: only the workers of a test serve it, so its jobs show who got them.
GUARDED_CATALOG = """
[[models]]
id = "null-guarded"
family = "null"
tasks = ["text2image"]
execution_mode = "legacy_call"
source = "builtin:null"
pipeline_class = "NullPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 1
"""
# About 5 s of steps.
SLOW_NULL = {"model": "null", "num_inference_steps": 100, "extra": {"sleep_ms_per_step": 50}}


@dataclass
class Cluster:
    controller: Controller
    real: Worker
    token_file: Path  # the controller's --worker-token-file
    audit_log: Path
    folder: Path

    def audit(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

    def token(self, name: str, token: str) -> Path:
        """A worker's own token file holding `token`."""
        path = self.folder / f"{name}.token"
        path.write_text(token + "\n")
        return path


def start_worker(
    log_dir: Path, address: str, worker_id: str, model_dir: Path, *extra: str, name: str = ""
) -> Worker:
    worker = Worker(
        log_dir, address, worker_id, model_dir, "--reconnect-max-s", "0.5", "--no-preload", *extra
    )
    worker.log_path = log_dir / f"{name or worker_id}.log"  # one log per process, ids may repeat
    return worker.start()


@pytest.fixture(scope="module")
def cluster(log_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("admission")
    token_file, audit_log, catalog = folder / "worker-token", folder / "audit.jsonl", folder / "guarded.toml"
    token_file.write_text(TOKEN + "\n")
    catalog.write_text(GUARDED_CATALOG)
    controller = Controller(
        log_dir,
        "--worker-token-file", str(token_file),
        "--audit-log", str(audit_log),
        "--catalog", str(catalog),
    ).start()  # fmt: skip
    cluster = Cluster(controller, None, token_file, audit_log, folder)  # type: ignore[arg-type]
    real_token = cluster.token("w-real", TOKEN)
    cluster.real = start_worker(
        log_dir, controller.address, "w-real", model_dir, "--models", "null", "--token-file", str(real_token)
    )
    try:
        controller.wait_worker("w-real")
        yield cluster
    finally:
        cluster.real.stop()
        controller.stop()


def refusal_line(worker: Worker) -> str:
    return next(line for line in worker.log().splitlines() if "refused this worker" in line)


def test_the_right_token_admits_a_worker_and_it_runs_jobs(cluster: Cluster) -> None:
    with omnirt.Client(cluster.controller.address, timeout=30) as client:
        result = client.generate(model="null", prompt="admitted", timeout=30)
    assert result.report.worker_id == "w-real"
    admitted = [line for line in cluster.audit() if line["outcome"] == "admitted"]
    assert admitted[0]["worker_id"] == "w-real" and admitted[0]["by"] == "token"
    assert str(admitted[0]["peer"]).startswith("ipv4:127.0.0.1:")


def test_workers_without_the_right_token_are_refused_exit_2_and_never_get_a_job(
    cluster: Cluster, log_dir: Path, model_dir: Path
) -> None:
    address = cluster.controller.address
    wrong = cluster.token("w-rogue-wrong", "wt-guessed-0000000000000000")
    with omnirt.Client(address, timeout=30) as client:
        guarded = client.submit(model="null-guarded", prompt="only for an admitted worker")
        rogues = [
            start_worker(log_dir, address, "w-rogue-none", model_dir, "--models", "null-guarded"),
            start_worker(
                log_dir, address, "w-rogue-wrong", model_dir, "--models", "null-guarded",
                "--token-file", str(wrong),
            ),
        ]  # fmt: skip
        try:
            for rogue in rogues:
                assert rogue.wait(120) == 2, rogue.log_tail()
        finally:
            for rogue in rogues:
                rogue.stop()
        assert "UNAUTHENTICATED" in refusal_line(rogues[0]) and "--token-file" in refusal_line(rogues[0])
        assert "UNAUTHENTICATED" in refusal_line(rogues[1]) and "not valid" in refusal_line(rogues[1])
        for rogue in rogues:
            # Never welcomed, and not retried either.
            assert "heartbeat" not in rogue.log() and "reconnecting in" not in rogue.log()
        assert client.get_job(guarded.id).state is JobState.QUEUED, "the job waits for an admitted worker"
        assert not cluster.controller.worker_ids() & {"w-rogue-none", "w-rogue-wrong"}
        refused = {
            line["worker_id"]: line["reason"] for line in cluster.audit() if line["outcome"] == "refused"
        }
        assert refused["w-rogue-none"] == "missing_token" and refused["w-rogue-wrong"] == "invalid_token"
        client.cancel(guarded.id)
    audit_text = cluster.audit_log.read_text()
    assert TOKEN not in audit_text and "wt-guessed" not in audit_text, "no token in the audit log"


def test_the_refusal_carries_the_standard_error_details(cluster: Cluster) -> None:
    hello = pb.Hello(worker_id="w-hand", execution_mode="legacy_call", backend="cpu", slots=1)
    with grpc.insecure_channel(cluster.controller.address) as channel:
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(channel).Connect(
            iter([pb.ConnectRequest(hello=hello)]), metadata=(("authorization", "Bearer nope"),), timeout=10
        )
        with pytest.raises(grpc.RpcError) as caught:
            next(stream)
    assert caught.value.code() is grpc.StatusCode.UNAUTHENTICATED
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.reason == "UNAUTHENTICATED"


def pids(controller: Controller, worker_id: str) -> list[int]:
    return [w.pid for w in controller.workers() if w.id == worker_id]


def test_a_rogue_claiming_a_live_workers_id_does_not_evict_it(
    cluster: Cluster, log_dir: Path, model_dir: Path
) -> None:
    address, real = cluster.controller.address, cluster.real
    wrong = cluster.token("w-real-rogue", "wt-stolen-id-000000000000000")
    with omnirt.Client(address, timeout=30) as client:
        job = client.submit(prompt="keeps its worker", **SLOW_NULL)
        for event in client.watch(job.id, timeout=60):
            if event.kind is EventKind.PROGRESS:
                break
        rogue = start_worker(
            log_dir, address, "w-real", model_dir, "--models", "null", "--token-file", str(wrong),
            name="w-real-rogue",
        )  # fmt: skip
        assert rogue.wait(60) == 2, rogue.log_tail()
        assert "UNAUTHENTICATED" in refusal_line(rogue)
        assert pids(cluster.controller, "w-real") == [real.pid]
        # With the right token, a second process still cannot take a live id.
        twin = start_worker(
            log_dir, address, "w-real", model_dir, "--models", "null",
            "--token-file", str(cluster.token("w-real-twin", TOKEN)), name="w-real-twin",
        )  # fmt: skip
        try:
            wait_for(lambda: "ALREADY_EXISTS" in twin.log(), 60, "the twin to be refused")
            assert pids(cluster.controller, "w-real") == [real.pid]
        finally:
            twin.stop()
        client.wait(job.id, timeout=60)
        final = client.get_job(job.id)
    assert final.state is JobState.SUCCEEDED and final.attempts == 1, final
    assert final.worker_id == "w-real" and real.alive()


def test_a_rotated_token_is_taken_on_sighup_and_a_worker_rereads_its_file_on_reconnect(
    cluster: Cluster, log_dir: Path, model_dir: Path
) -> None:
    # Last in the module: it leaves the controller on NEW_TOKEN.
    controller = cluster.controller
    proxy = HalfDeadProxy(controller.port)  # cut() makes the worker reconnect
    rot_token = cluster.token("w-rot", TOKEN)
    rot = start_worker(
        log_dir, f"127.0.0.1:{proxy.port}", "w-rot", model_dir, "--models", "null-guarded",
        "--token-file", str(rot_token),
    )  # fmt: skip
    old: Worker | None = None
    try:
        controller.wait_worker("w-rot")
        cluster.token_file.write_text(NEW_TOKEN + "\n")
        rot_token.write_text(NEW_TOKEN + "\n")  # as a Secret volume is updated
        controller.signal(signal.SIGHUP)
        wait_for(
            lambda: any(
                line["event"] == "worker_token" and line["outcome"] == "reloaded" for line in cluster.audit()
            ),
            10,
            "the controller to reload the token file",
        )
        old = start_worker(
            log_dir, controller.address, "w-old-token", model_dir, "--models", "null-guarded",
            "--token-file", str(cluster.token("w-old-token", TOKEN)),
        )  # fmt: skip
        assert old.wait(60) == 2, old.log_tail()
        assert "not valid" in refusal_line(old)

        def admissions() -> int:
            return sum(
                1
                for line in cluster.audit()
                if line.get("worker_id") == "w-rot" and line["outcome"] == "admitted"
            )

        assert admissions() == 1
        proxy.cut()
        wait_for(lambda: admissions() == 2, 30, "the worker to be admitted again with the new token")
        with omnirt.Client(controller.address, timeout=30) as client:
            result = client.generate(model="null-guarded", prompt="after rotation", timeout=60)
        assert result.report.worker_id == "w-rot" and rot.alive()
        assert "refused" not in rot.log()
    finally:
        for worker in (rot, old):
            if worker is not None:
                worker.stop()
        proxy.close()


# ---- over TLS -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    worker: Issued  # a client certificate, CN w-cert
    other_ca: Issued  # signs nothing this controller knows


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca = make_ca(folder)
    return Pki(
        ca,
        make_cert(ca, folder, "controller"),
        make_cert(ca, folder, "w-cert", client=True),
        make_ca(folder / "other", "other-ca"),
    )


class TlsController(Controller):
    """A controller serving TLS: health and ListWorkers over TLS, trusting `ca`."""

    def __init__(self, log_dir: Path, ca: Issued, *extra: str) -> None:
        super().__init__(log_dir, *extra)
        self.credentials = grpc.ssl_channel_credentials(Path(ca.cert).read_bytes())

    def start(self, timeout: float = 30) -> Self:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        Daemon.start(self)
        with grpc.secure_channel(self.address, self.credentials) as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def ready() -> bool:
                if not self.alive():
                    raise RuntimeError(f"controller exited:\n{self.log()}")
                return bool(stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1)

            wait_for(ready, timeout, "the TLS controller to serve")
        return self

    def workers(self) -> list[cluster_pb2.WorkerInfo]:
        with grpc.secure_channel(self.address, self.credentials) as channel:
            stub = cluster_pb2_grpc.ClusterServiceStub(channel)
            return list(stub.ListWorkers(cluster_pb2.ListWorkersRequest(), timeout=5).workers)


def test_a_worker_verifying_a_tls_controller_is_admitted_by_token_and_runs_a_job(
    pki: Pki, log_dir: Path, model_dir: Path, tmp_path: Path
) -> None:
    token_file = tmp_path / "worker-token"
    token_file.write_text(TOKEN)
    controller = TlsController(
        log_dir, pki.ca, "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
        "--worker-token-file", str(token_file),
    ).start()  # fmt: skip
    address = controller.address
    good = start_worker(
        log_dir, address, "w-tls", model_dir, "--models", "null", "--tls-ca", pki.ca.cert,
        "--token-file", str(token_file),
    )  # fmt: skip
    untrusting = start_worker(
        log_dir, address, "w-untrusting", model_dir, "--models", "null", "--tls-ca", pki.other_ca.cert,
        "--token-file", str(token_file),
    )  # fmt: skip
    plain = start_worker(
        log_dir, address, "w-plain", model_dir, "--models", "null", "--token-file", str(token_file)
    )
    try:
        controller.wait_worker("w-tls")
        with omnirt.Client(address, timeout=30, credentials=controller.credentials) as client:
            result = client.generate(model="null", prompt="over TLS", timeout=30)
        assert result.report.worker_id == "w-tls"
        # Not trusting the controller, or not speaking TLS, is retried, with a line saying why.
        wait_for(lambda: "not signed by a CA this worker trusts" in untrusting.log(), 30, "the TLS failure")
        wait_for(lambda: "pass --tls-ca FILE or --tls" in plain.log(), 30, "the plaintext failure")
        assert untrusting.alive() and plain.alive()
        assert controller.worker_ids() == {"w-tls"}
    finally:
        for worker in (good, untrusting, plain):
            assert worker.stop() == 0, worker.log_tail()
        controller.stop()


def test_on_an_mtls_worker_port_a_client_certificate_admits_without_a_token(
    pki: Pki, log_dir: Path, model_dir: Path, tmp_path: Path
) -> None:
    audit_log = tmp_path / "audit.jsonl"
    worker_port = free_port()
    controller = TlsController(
        log_dir, pki.ca, "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
        "--tls-client-ca", pki.ca.cert, "--worker-listen", f"127.0.0.1:{worker_port}",
        "--audit-log", str(audit_log),
    ).start()  # fmt: skip
    workers_at = f"127.0.0.1:{worker_port}"
    with_cert = start_worker(
        log_dir, workers_at, "w-cert", model_dir, "--models", "null", "--tls-ca", pki.ca.cert,
        "--tls-cert", pki.worker.cert, "--tls-key", pki.worker.key,
    )  # fmt: skip
    without = start_worker(
        log_dir, workers_at, "w-nocert", model_dir, "--models", "null", "--tls-ca", pki.ca.cert
    )
    try:
        controller.wait_worker("w-cert")
        with omnirt.Client(controller.address, timeout=30, credentials=controller.credentials) as client:
            result = client.generate(model="null", prompt="mTLS", timeout=30)
        assert result.report.worker_id == "w-cert"
        lines = [json.loads(line) for line in audit_log.read_text().splitlines()]
        admitted = [line for line in lines if line["event"] == "worker" and line["outcome"] == "admitted"]
        assert [(a["worker_id"], a["by"], a["identity"]) for a in admitted] == [
            ("w-cert", "certificate", "w-cert")
        ]
        # Without a certificate the handshake fails: retried, never admitted, never a job.
        wait_for(lambda: "pass --tls-cert and --tls-key" in without.log(), 30, "the handshake failure")
        assert without.alive() and controller.worker_ids() == {"w-cert"}
    finally:
        for worker in (with_cert, without):
            assert worker.stop() == 0, worker.log_tail()
        controller.stop()
