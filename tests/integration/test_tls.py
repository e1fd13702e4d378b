"""TLS on both edges through real daemons: the SDK, omnirtctl and the `openai` client over TLS
with an API key, plaintext and untrusted clients refused, SIGHUP certificate reload that keeps
open streams, the worker port's mTLS, and the Redis store over rediss://.

One controller for most of the module: TLS on gRPC and HTTP, API keys, and a worker port of
its own that requires client certificates (`--worker-listen`, `--tls-client-ca`), with one
worker admitted by its certificate. Certificates are made here (tests/certs.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import io
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from cryptography import x509
from PIL import Image

import omnirt
from omnirt import errors
from omnirt._internal.protocol.v1 import gateway_pb2, gateway_pb2_grpc
from omnirt.controller.edges.auth import key_digest
from omnirt.types import EventKind, Job, JobEvent, JobState
from tests.certs import Issued, make_ca, make_cert
from tests.daemons import Controller, Daemon, RedisServer, Worker, free_port, wait_for

USER_KEY = "alice-" + "k" * 32
ADMIN_KEY = "ops-" + "a" * 32
# Waiting-room model from tests/conftest.py: no worker here serves it, its jobs stay queued.
QUEUED_MODEL = "unserved-sd"


class Pki:
    """The module's certificates: a CA, the controller's, a worker's, and a CA nobody trusts."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = make_ca(folder)
        self.server = make_cert(self.ca, folder, "controller")
        self.worker = make_cert(self.ca, folder, "w-tls", client=True)
        self.other_ca = make_ca(folder / "other", "other-ca")
        self.stranger = make_cert(self.other_ca, folder / "other", "w-stranger", client=True)


def key_file(folder: Path) -> Path:
    path = folder / "keys.toml"
    path.write_text(
        f'[[keys]]\ntenant = "alice"\nrole = "user"\nsha256 = "{key_digest(USER_KEY)}"\n\n'
        f'[[keys]]\ntenant = "ops"\nrole = "admin"\nsha256 = "{key_digest(ADMIN_KEY)}"\n'
    )
    return path


def served_serial(port: int, ca: str) -> int:
    """The serial of the certificate a new TLS handshake on `port` is given (verified by `ca`)."""
    pem = ssl.get_server_certificate(("127.0.0.1", port), ca_certs=ca, timeout=5)
    return x509.load_pem_x509_certificate(pem.encode()).serial_number


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def worker_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def controller(
    log_dir: Path, user_catalog: Path, pki: Pki, worker_port: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Controller]:
    keys = key_file(tmp_path_factory.mktemp("keys"))
    daemon = Controller(
        log_dir,
        "--catalog", str(user_catalog),
        "--tls-cert", pki.server.cert, "--tls-key", pki.server.key,
        "--tls-client-ca", pki.ca.cert,
        "--worker-listen", f"127.0.0.1:{worker_port}",
        "--auth-keys", str(keys),
        http=True, tls_ca=pki.ca.cert, api_key=ADMIN_KEY,
    ).start()  # fmt: skip
    yield daemon
    daemon.stop()


def tls_worker(log_dir: Path, worker_port: int, model_dir: Path, worker_id: str, *flags: str) -> Worker:
    return Worker(log_dir, f"127.0.0.1:{worker_port}", worker_id, model_dir, "--slots", "1", *flags)


@pytest.fixture(scope="module")
def worker(
    controller: Controller, pki: Pki, log_dir: Path, model_dir: Path, worker_port: int
) -> Iterator[Worker]:
    certs = ("--tls-ca", pki.ca.cert, "--tls-cert", pki.worker.cert, "--tls-key", pki.worker.key)
    daemon = tls_worker(log_dir, worker_port, model_dir, "w-tls", *certs).start()
    controller.wait_worker("w-tls", timeout=120)
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, pki: Pki) -> Iterator[omnirt.Client]:
    with omnirt.Client(controller.address, ca=pki.ca.cert, api_key=USER_KEY, timeout=30) as c:
        yield c


def https_context(ca: str, cert: Issued | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert.cert, cert.key)
    return context


# ---- the SDK ---------------------------------------------------------------------------


def test_sdk_generates_over_tls_with_an_api_key(client: omnirt.Client, worker: Worker) -> None:
    result = client.generate(
        model="tiny-sd", prompt="a lighthouse", seed=7, num_inference_steps=2, timeout=180
    )
    assert result.artifacts and result.artifacts[0].data.startswith(b"\x89PNG")
    assert client.get_job(result.job_id).tenant == "alice", "the key's tenant owns the job"
    assert "k" * 32 not in repr(client) and repr(client).endswith("tls=True)")


def test_async_client_over_tls_with_an_api_key(controller: Controller, pki: Pki) -> None:
    async def run() -> tuple[JobEvent, Job]:
        async with omnirt.AsyncClient(
            controller.address, ca=pki.ca.cert, api_key=USER_KEY, timeout=30
        ) as aio:
            job = await aio.submit(model=QUEUED_MODEL, prompt="async over tls")
            async with contextlib.aclosing(aio.watch(job.id)) as events:  # a stream through the interceptor
                first = await anext(events)
            assert (await aio.cancel(job.id)).cancelled
            return first, await aio.get_job(job.id)

    first, job = asyncio.run(run())
    assert first.kind is EventKind.STATE and first.state is JobState.QUEUED
    assert job.tenant == "alice" and job.state is JobState.CANCELLED


def test_the_key_goes_with_the_raw_stubs_and_is_needed(controller: Controller, pki: Pki) -> None:
    from omnirt.v1 import models_pb2

    with omnirt.Client(controller.address, ca=pki.ca.cert, api_key=USER_KEY) as keyed:
        assert keyed.models.ListModels(models_pb2.ListModelsRequest(), timeout=10).models
    with (
        omnirt.Client(controller.address, ca=pki.ca.cert, api_key="") as anonymous,
        pytest.raises(errors.Unauthenticated),
    ):
        anonymous.list_models()
    with (
        omnirt.Client(controller.address, ca=pki.ca.cert, api_key="wrong-key") as wrong,
        pytest.raises(errors.Unauthenticated) as refused,
    ):
        wrong.list_models()
    assert "wrong-key" not in str(refused.value)


def test_environment_gives_ca_and_key(
    controller: Controller, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMNIRT_TLS_CA", pki.ca.cert)
    monkeypatch.setenv("OMNIRT_API_KEY", USER_KEY)
    with omnirt.Client(controller.address) as from_env:
        assert from_env.tls and any(m.id == "tiny-sd" for m in from_env.list_models())


def test_plaintext_client_is_refused_and_the_controller_keeps_serving(
    controller: Controller, client: omnirt.Client, pki: Pki
) -> None:
    with (
        omnirt.Client(controller.address, tls=False, api_key=USER_KEY, timeout=5) as plain,
        pytest.raises(errors.Unavailable) as refused,
    ):
        plain.list_models()
    assert controller.address in str(refused.value)
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the https gateway
        httpx.get(controller.http.replace("https://", "http://") + "/healthz", timeout=5)
    assert controller.alive() and client.list_models(), "TLS clients are still served"
    assert httpx.get(controller.http + "/healthz", verify=https_context(pki.ca.cert)).status_code == 200


def test_a_client_that_does_not_trust_the_ca_is_refused(controller: Controller, pki: Pki) -> None:
    with (
        omnirt.Client(controller.address, ca=pki.other_ca.cert, api_key=USER_KEY, timeout=5) as untrusting,
        pytest.raises(errors.Unavailable),
    ):
        untrusting.list_models()
    with (
        omnirt.Client(controller.address, tls=True, api_key=USER_KEY, timeout=5) as system_roots,
        pytest.raises(errors.Unavailable),
    ):  # the test CA is in no system store
        system_roots.list_models()
    with pytest.raises(httpx.ConnectError):
        httpx.get(controller.http + "/healthz", verify=https_context(pki.other_ca.cert), timeout=5)


# ---- HTTP: the openai client over https ------------------------------------------------------


def test_openai_client_generates_an_image_over_https(
    controller: Controller, pki: Pki, worker: Worker
) -> None:
    # openai's own httpx client class, verifying the gateway against the test CA.
    with openai.DefaultHttpxClient(verify=https_context(pki.ca.cert), timeout=120) as http:
        oai = openai.OpenAI(
            base_url=controller.http + "/v1", api_key=USER_KEY, http_client=http, max_retries=0
        )
        response = oai.images.generate(
            model="tiny-sd",
            prompt="a lighthouse",
            size="64x64",
            extra_body={"seed": 3, "num_inference_steps": 2},
        )
        assert response.data is not None
        image = Image.open(io.BytesIO(base64.b64decode(response.data[0].b64_json or "")))
        assert image.format == "PNG" and image.size == (64, 64)
        refused = openai.OpenAI(
            base_url=controller.http + "/v1", api_key="wrong", http_client=http, max_retries=0
        )
        with pytest.raises(openai.AuthenticationError):
            refused.images.generate(model="tiny-sd", prompt="x", size="64x64")


# ---- omnirtctl -------------------------------------------------------------------------


def omnirtctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "omnirt.cli.main"]
    clean = {k: v for k, v in os.environ.items() if k not in ("OMNIRT_TLS_CA", "OMNIRT_API_KEY")}
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, timeout=180, env={**clean, **(env or {})}
    )


def test_omnirtctl_generates_over_tls_with_an_api_key(
    controller: Controller, pki: Pki, worker: Worker, tmp_path: Path
) -> None:
    done = omnirtctl(
        "--controller", controller.address, "--tls-ca", pki.ca.cert, "--api-key", USER_KEY,
        "generate", "--model", "tiny-sd", "--prompt", "a fox", "--steps", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert [p.read_bytes()[:4] for p in tmp_path.glob("*.png")] == [b"\x89PNG"]
    # The key from the environment, the CA after the subcommand; without a key: refused.
    listed = omnirtctl("-c", controller.address, "models", "list", "--tls-ca", pki.ca.cert,
                       env={"OMNIRT_API_KEY": USER_KEY})  # fmt: skip
    assert listed.returncode == 0 and "tiny-sd" in listed.stdout, listed.stderr
    refused = omnirtctl("-c", controller.address, "--tls-ca", pki.ca.cert, "models", "list")
    assert refused.returncode == 1 and "API key" in refused.stderr
    missing = omnirtctl("-c", controller.address, "--tls-ca", str(pki.folder / "nope.pem"), "models", "list")
    assert missing.returncode == 2 and "nope.pem" in missing.stderr


# ---- the worker port: mTLS ---------------------------------------------------------------


def test_the_public_port_does_not_serve_the_worker_stream(controller: Controller, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(
        Path(pki.ca.cert).read_bytes(), Path(pki.worker.key).read_bytes(), Path(pki.worker.cert).read_bytes()
    )
    with grpc.secure_channel(controller.address, credentials) as channel:
        stream = gateway_pb2_grpc.WorkerGatewayServiceStub(channel).Connect(
            iter([gateway_pb2.ConnectRequest(hello=gateway_pb2.Hello(worker_id="w-public", slots=1))]),
            timeout=5,
        )
        with pytest.raises(grpc.RpcError) as refused:
            next(stream)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_a_worker_pointed_at_the_public_port_is_told_the_worker_port(
    controller: Controller, pki: Pki, log_dir: Path, model_dir: Path
) -> None:
    port = int(controller.address.rsplit(":", 1)[1])
    lost = tls_worker(
        log_dir, port, model_dir, "w-lost",
        "--tls-ca", pki.ca.cert, "--tls-cert", pki.worker.cert, "--tls-key", pki.worker.key,
    ).start()  # fmt: skip
    try:
        wait_for(lambda: "--worker-listen port" in lost.log(), 60, "the hint in the worker's log")
        assert "w-lost" not in controller.worker_ids()
    finally:
        lost.stop()


def test_a_worker_joins_the_worker_port_only_with_a_client_certificate(
    controller: Controller, pki: Pki, worker: Worker, log_dir: Path, model_dir: Path, worker_port: int
) -> None:
    assert "w-tls" in controller.worker_ids(), "admitted by its certificate"
    strangers = [
        tls_worker(log_dir, worker_port, model_dir, "w-nocert", "--tls-ca", pki.ca.cert).start(),
        tls_worker(
            log_dir, worker_port, model_dir, "w-stranger",
            "--tls-ca", pki.ca.cert, "--tls-cert", pki.stranger.cert, "--tls-key", pki.stranger.key,
        ).start(),
    ]  # fmt: skip
    try:
        # Both reach the port, whose handshake refuses them (with a hint): they never join.
        hint = "pass --tls-cert and --tls-key"
        wait_for(lambda: all(hint in w.log() or not w.alive() for w in strangers), 90, "both refusals")
        assert controller.worker_ids() == {"w-tls"}
    finally:
        for stranger in strangers:
            stranger.stop()


def test_a_worker_preloads_from_the_worker_ports_catalog_by_its_certificate(
    controller: Controller, pki: Pki, log_dir: Path, model_dir: Path, worker_port: int
) -> None:
    """The worker port serves ModelService too: an admitted worker (here by its certificate, no
    token, API keys on) reads the catalog there to preload its models."""
    certs = ("--tls-ca", pki.ca.cert, "--tls-cert", pki.worker.cert, "--tls-key", pki.worker.key)
    preloading = tls_worker(
        log_dir, worker_port, model_dir, "w-preload", "--models", "null", "--preload", *certs
    )
    preloading.start()
    try:
        wait_for(lambda: "model null preloaded" in preloading.log(), 60, "the preload")
        assert "does not describe" not in preloading.log()
    finally:
        preloading.stop()


# ---- SIGHUP: a new certificate for new connections, open streams kept ------------------------


def test_sighup_reloads_the_certificate_and_keeps_open_streams(
    controller: Controller, client: omnirt.Client, pki: Pki, worker: Worker, worker_port: int
) -> None:
    grpc_port, http_port = controller.port, int(controller.http.rsplit(":", 1)[1])
    before = {p: served_serial(p, pki.ca.cert) for p in (grpc_port, http_port, worker_port)}
    assert set(before.values()) == {pki.server.serial}
    worker_since = next(w.connected_at for w in controller.workers() if w.id == "w-tls")
    job = client.submit(model=QUEUED_MODEL, prompt="waits through the reload")
    events = client.watch(job.id)
    assert next(events).state is JobState.QUEUED  # the stream is open

    # A broken key file first: the certificate in use stays, with an error in the log.
    key_pem = Path(pki.server.key).read_bytes()
    Path(pki.server.key).write_text("not a key\n")
    controller.signal(signal.SIGHUP)
    wait_for(lambda: "TLS reload failed" in controller.log(), 10, "the failed reload to be logged")
    assert served_serial(grpc_port, pki.ca.cert) == pki.server.serial
    Path(pki.server.key).write_bytes(key_pem)

    renewed = make_cert(pki.ca, pki.folder, "controller")  # same files, a new certificate
    controller.signal(signal.SIGHUP)

    def renewed_on(port: int) -> bool:
        return served_serial(port, pki.ca.cert) == renewed.serial

    for port in (grpc_port, http_port, worker_port):
        wait_for(functools.partial(renewed_on, port), 10, f"port {port} to reload")

    # The stream opened before the reload still delivers, and the worker stream was not dropped.
    assert client.cancel(job.id).cancelled
    assert any(e.state is JobState.CANCELLED for e in events)
    assert next(w.connected_at for w in controller.workers() if w.id == "w-tls") == worker_since
    result = client.generate(model="tiny-sd", prompt="after the reload", num_inference_steps=2, timeout=120)
    assert result.artifacts[0].data.startswith(b"\x89PNG")
    with omnirt.Client(controller.address, ca=pki.ca.cert, api_key=USER_KEY, timeout=10) as fresh:
        assert fresh.list_models(), "a new connection handshakes with the new certificate"


# ---- client certificates on the public edges -------------------------------------------------


@pytest.mark.parametrize("public_flag", [True, False], ids=["public-client-auth", "one-port"])
def test_client_certificates_on_the_public_port(
    log_dir: Path, user_catalog: Path, pki: Pki, tmp_path: Path, public_flag: bool
) -> None:
    """--tls-public-client-auth: gRPC and HTTP both need one; --tls-client-ca without a worker
    port: the one gRPC port needs one from every caller (said in the log), HTTP does not."""
    caller = make_cert(pki.ca, tmp_path, "a-caller", client=True)
    daemon = Controller(
        log_dir,
        "--catalog", str(user_catalog),
        "--tls-cert", pki.server.cert, "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert,
        *(["--tls-public-client-auth"] if public_flag else []),
        http=True, tls_ca=pki.ca.cert,
    )  # fmt: skip
    Daemon.start(daemon)  # not Controller.start: its readiness check has no client certificate
    try:
        wait_for(
            lambda: "omnirt-controller listening on" in daemon.log() or not daemon.alive(), 30, "startup"
        )
        assert daemon.alive(), daemon.log()
        assert ("required on" in daemon.log() and "for every caller" in daemon.log()) is not public_flag
        with (
            omnirt.Client(daemon.address, ca=pki.ca.cert, timeout=5) as no_cert,
            pytest.raises(errors.Unavailable),
        ):
            no_cert.list_models()
        with omnirt.Client(
            daemon.address, ca=pki.ca.cert, cert=caller.cert, key=caller.key, timeout=10
        ) as mtls:
            assert mtls.list_models()
        healthz = daemon.http + "/healthz"
        if public_flag:
            with pytest.raises(httpx.HTTPError):
                httpx.get(healthz, verify=https_context(pki.ca.cert), timeout=5)
        else:
            assert httpx.get(healthz, verify=https_context(pki.ca.cert), timeout=5).status_code == 200
        assert httpx.get(healthz, verify=https_context(pki.ca.cert, caller), timeout=5).status_code == 200
    finally:
        daemon.stop()


# ---- Redis over TLS ---------------------------------------------------------------------


class TlsRedis(RedisServer):
    """redis-server that speaks only TLS (`--port 0 --tls-port PORT`)."""

    def __init__(self, log_dir: Path, pki: Pki) -> None:
        super().__init__(log_dir)
        self.url = f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={pki.ca.cert}"
        self.argv = [
            "redis-server", "--port", "0", "--tls-port", str(self.port), "--bind", "127.0.0.1",
            "--tls-cert-file", pki.server.cert, "--tls-key-file", pki.server.key,
            "--tls-ca-cert-file", pki.ca.cert, "--tls-auth-clients", "no",
            "--save", "", "--appendonly", "no", "--dir", str(log_dir),
        ]  # fmt: skip

    def start(self, timeout: float = 10) -> TlsRedis:
        Daemon.start(self)
        wait_for(lambda: "Ready to accept connections" in self.log() or not self.alive(), timeout, "redis")
        assert self.alive(), self.log()
        return self


def test_the_redis_store_works_over_rediss(log_dir: Path, user_catalog: Path, pki: Pki) -> None:
    redis = TlsRedis(log_dir, pki).start()
    try:
        daemon = Controller(log_dir, "--catalog", str(user_catalog), "--store", redis.url).start()
        try:
            with omnirt.Client(daemon.address, timeout=10) as plain_edge:
                job = plain_edge.submit(model=QUEUED_MODEL, prompt="kept in redis over TLS")
                assert plain_edge.get_job(job.id).state is JobState.QUEUED
                assert [j.id for j in plain_edge.list_jobs()] == [job.id]
                assert plain_edge.cancel(job.id).cancelled
        finally:
            daemon.stop()
        with socket.create_connection(("127.0.0.1", redis.port), timeout=5) as conn:
            conn.sendall(b"PING\r\n")  # plaintext is not answered: the store really used TLS
            with contextlib.suppress(OSError):
                assert not conn.recv(16).startswith(b"+PONG")
    finally:
        redis.stop()


# ---- startup errors ----------------------------------------------------------------------


def test_unusable_tls_flags_stop_the_controller_with_one_line(pki: Pki) -> None:
    cases = {
        ("--tls-cert", pki.server.cert): (
            f"--tls-cert {pki.server.cert}: needs --tls-key (the certificate's private key)"
        ),
        ("--tls-cert", pki.server.cert, "--tls-key", pki.worker.key): (
            f"--tls-key {pki.worker.key}: the key does not match the certificate in {pki.server.cert}"
        ),
    }
    for flags, message in cases.items():
        argv = [
            sys.executable,
            "-m",
            "omnirt.controller.main",
            "--listen",
            f"127.0.0.1:{free_port()}",
            *flags,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [f"omnirt-controller: {message}"]
