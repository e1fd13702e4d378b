"""Webhooks through real daemons and a real receiver (an aiohttp server on loopback).

A job that names a webhook gets its events POSTed, signed the Standard Webhooks way (checked
here with the `standardwebhooks` package), with a stable `webhook-id` per event, retried with
backoff (a receiver that fails twice gets the same id three times), throttled progress, and
each event once when two controllers share one Redis. Loopback is refused without
--webhook-allow (INVALID_ARGUMENT naming webhook.url on gRPC and HTTP), and so is ftp://.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

import omnirt
from omnirt import errors
from omnirt.controller.edges.auth import key_digest
from tests.conftest import QUEUED_VIDEO, USER_CATALOG
from tests.daemons import Controller, RedisServer, Worker, free_port, wait_for
from tests.e2e.test_cli import omnirtctl

FAST_RETRIES = ("--webhook-backoff-s", "0.05", "--webhook-retry-s", "3", "--webhook-timeout-s", "2")
ALLOW = ("--webhook-allow", "127.0.0.1/32", *FAST_RETRIES)
SLOW_STEPS = {"sleep_ms_per_step": 50}


@dataclass
class Delivery:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes
    status: int
    at: float = field(default_factory=time.monotonic)  # when it arrived

    @property
    def id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def payload(self) -> dict[str, Any]:
        return dict(json.loads(self.body))


@dataclass
class Receiver:
    """An aiohttp server in a thread of its own. `/ok/...` answers 204; `/flaky/...` answers 500
    to the first two attempts of each webhook-id, then 200; `/redirect/...` answers 307."""

    port: int = field(default_factory=free_port)
    deliveries: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def got(self, prefix: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path.startswith(prefix)]

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        kind = request.path.split("/")[1]
        with self.lock:
            seen = sum(
                1 for d in self.deliveries if d.headers.get("webhook-id") == request.headers.get("webhook-id")
            )
            status = {"ok": 204, "redirect": 307}.get(kind, 500 if seen < 2 else 200)
            self.deliveries.append(Delivery(request.path, dict(request.headers), body, status))
        if status == 307:
            raise web.HTTPTemporaryRedirect(self.url("/ok/redirected"))
        return web.Response(status=status)

    def serve(self) -> Iterator[Receiver]:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5)
            loop.run_until_complete(runner.cleanup())
            loop.close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    yield from Receiver().serve()


@pytest.fixture(scope="module")
def user_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "hooks.toml"
    path.write_text(USER_CATALOG + QUEUED_VIDEO)
    return path


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), *ALLOW, http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(log_dir, controller.address, "w-hooks", model_dir, "--models", "null").start()
    controller.wait_worker("w-hooks")
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller, worker: Worker) -> Iterator[omnirt.Client]:
    with controller.client() as c:
        yield c


def verify(delivery: Delivery, secret: str) -> dict[str, Any]:
    """The payload, once `standardwebhooks` accepts its signature (it raises otherwise)."""
    headers = {k: delivery.headers[k] for k in ("webhook-id", "webhook-timestamp", "webhook-signature")}
    return dict(Verifier(secret).verify(delivery.body, headers))


def wait_types(receiver: Receiver, prefix: str, last: str, timeout: float = 30) -> list[Delivery]:
    wait_for(
        lambda: any(d.payload["type"] == last for d in receiver.got(prefix)), timeout, f"{last} at {prefix}"
    )
    return receiver.got(prefix)


def test_events_arrive_signed_in_order_with_throttled_progress(
    client: omnirt.Client, receiver: Receiver, controller: Controller
) -> None:
    job = client.submit(
        model="null",
        prompt="x",
        num_inference_steps=30,
        extra=SLOW_STEPS,
        webhook=omnirt.Webhook(url=receiver.url("/ok/events"), progress_interval_ms=400),
    )
    got = wait_types(receiver, "/ok/events", "job.completed")
    secret = client.webhook_secret()
    assert secret.startswith("whsec_")
    payloads = [verify(d, secret) for d in got]
    types = [p["type"] for p in payloads]
    assert types[:2] == ["job.queued", "job.started"] and types[-1] == "job.completed"
    progress = [p for p in payloads if p["type"] == "job.progress"]
    # 30 steps of 50 ms, at most one progress per 400 ms: a handful, not 30, and never closer.
    assert 1 <= len(progress) < 15, types
    arrived = [d.at for d in got if d.payload["type"] == "job.progress"]
    assert all(b - a >= 0.35 for a, b in itertools.pairwise(arrived)), arrived
    steps = [p["data"]["progress"]["step"] for p in progress]
    assert steps == sorted(steps)
    assert len({d.id for d in got}) == len(got)  # one id per event
    assert [p["sequence"] for p in payloads] == sorted(p["sequence"] for p in payloads)
    done = payloads[-1]["data"]
    assert done["id"] == job.id and done["state"] == "JOB_STATE_SUCCEEDED"
    # The job shows its webhook as validated (all events: an empty list; the interval asked).
    shown = omnirt.Webhook(url=receiver.url("/ok/events"), events=[], progress_interval_ms=400)
    assert client.get_job(job.id).webhook == shown
    assert done["webhook"]["url"] == shown.url
    artifact = done["result"]["artifacts"][0]
    assert not artifact.get("data") and artifact["uri"] == f"{controller.http}/v1/jobs/{job.id}/artifacts/0"
    assert httpx.get(artifact["uri"]).content[:8] == b"\x89PNG\r\n\x1a\n"
    # A wrong secret does not verify.
    with pytest.raises(WebhookVerificationError):
        verify(got[0], "whsec_" + "A" * 44)


def test_a_receiver_that_fails_twice_gets_the_same_id_three_times(
    client: omnirt.Client, receiver: Receiver
) -> None:
    job = client.submit(
        model="null", prompt="x", webhook=receiver.url("/flaky/a"), webhook_events=["completed"]
    )
    wait_for(lambda: any(d.status == 200 for d in receiver.got("/flaky/a")), 30, "the third attempt")
    got = receiver.got("/flaky/a")
    assert [d.status for d in got] == [500, 500, 200]
    assert {d.id for d in got} == {f"msg_{job.id}_{verify(got[0], client.webhook_secret())['sequence']}"}
    assert {d.payload["type"] for d in got} == {"job.completed"}
    assert client.get_job(job.id).state is omnirt.JobState.SUCCEEDED


def deliveries(controller: Controller, outcome: str) -> float:
    """`omnirt_webhook_deliveries_total{outcome}` on the controller's /metrics (0 before any)."""
    for line in httpx.get(f"{controller.http}/metrics").text.splitlines():
        if line.startswith(f'omnirt_webhook_deliveries_total{{outcome="{outcome}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_job_succeeds_while_its_receiver_is_down(client: omnirt.Client, controller: Controller) -> None:
    retried, gave_up = deliveries(controller, "retry"), deliveries(controller, "gave_up")
    dead = f"http://127.0.0.1:{free_port()}/nobody"
    result = client.generate(model="null", prompt="x", webhook=dead, webhook_events=["completed"])
    assert result.artifacts
    # Retried with backoff, then given up once --webhook-retry-s (3 s here) has passed.
    wait_for(lambda: deliveries(controller, "gave_up") == gave_up + 1, 20, "the delivery to give up")
    assert deliveries(controller, "retry") >= retried + 2


def test_async_client_takes_webhooks_too(
    client: omnirt.Client, controller: Controller, receiver: Receiver
) -> None:
    async def run() -> tuple[str, str]:
        async with omnirt.AsyncClient(controller.address) as aio:
            hook = receiver.url("/ok/aio")
            job = await aio.submit(model="null", prompt="x", webhook=hook, webhook_events=["completed"])
            return job.id, await aio.webhook_secret()

    job_id, secret = asyncio.run(run())
    assert secret == client.webhook_secret()
    got = wait_types(receiver, "/ok/aio", "job.completed")
    assert verify(got[0], secret)["data"]["id"] == job_id


def test_redirects_are_not_followed(client: omnirt.Client, receiver: Receiver) -> None:
    client.submit(model="null", prompt="x", webhook=receiver.url("/redirect/r"), webhook_events=["completed"])
    wait_for(lambda: len(receiver.got("/redirect/r")) >= 2, 20, "a retry of the redirected delivery")
    assert not receiver.got("/ok/redirected")


def test_failed_and_cancelled_events(client: omnirt.Client, receiver: Receiver) -> None:
    failing = client.submit(model="null", prompt="x", extra={"bogus": 1}, webhook=receiver.url("/ok/failed"))
    got = wait_types(receiver, "/ok/failed", "job.failed")
    assert got[-1].payload["data"]["id"] == failing.id
    assert got[-1].payload["data"]["error"]["field"] == "extra.bogus"
    # queued-video: no worker of this module runs it, so it waits until cancelled.
    queued = client.submit(
        model="queued-video",
        prompt="x",
        webhook=receiver.url("/ok/cancel"),
        webhook_events=["queued", "cancelled"],
    )
    wait_types(receiver, "/ok/cancel", "job.queued")
    client.cancel(queued.id)
    got = wait_types(receiver, "/ok/cancel", "job.cancelled")
    assert [d.payload["type"] for d in got] == ["job.queued", "job.cancelled"]


def test_omnirtctl_generate_with_a_webhook_and_the_secret_command(
    client: omnirt.Client, controller: Controller, receiver: Receiver, tmp_path: Path
) -> None:
    hook = receiver.url("/ok/cli")
    args = ("--webhook", hook, "--webhook-events", "completed", "--out", str(tmp_path))
    omnirtctl(controller, "generate", "--model", "null", "--prompt", "x", *args)
    got = wait_types(receiver, "/ok/cli", "job.completed")
    secret = omnirtctl(controller, "webhooks", "secret").stdout.strip()
    assert secret == client.webhook_secret()
    verify(got[0], secret)
    refused = omnirtctl(
        controller, "generate", "--model", "null", "--prompt", "x", "--webhook", "ftp://x/y", check=False
    )
    assert refused.returncode != 0 and "webhook.url" in refused.stderr


def test_bad_webhooks_are_invalid_and_queue_nothing(client: omnirt.Client, controller: Controller) -> None:
    cases = {
        "ftp://example.com/hook": "webhook.url",
        "http://user:pw@127.0.0.1/x": "webhook.url",
        "http://" + "a" * 3000 + ".com/": "webhook.url",
    }
    for url, name in cases.items():
        with pytest.raises(errors.InvalidRequest) as caught:
            client.submit(model="null", prompt="x", webhook=url)
        assert caught.value.field == name, url
    with pytest.raises(errors.InvalidRequest) as caught:
        client.submit(
            model="null", prompt="x", webhook=omnirt.Webhook("http://127.0.0.1/", progress_interval_ms=5)
        )
    assert caught.value.field == "webhook.progress_interval_ms"
    with pytest.raises(errors.InvalidRequest) as caught:
        client.submit(model="null", prompt="x", webhook="http://127.0.0.1/", webhook_events=["done"])
    assert caught.value.field == "webhook.events"
    body = {
        "model": "null",
        "prompt": "x",
        "webhook": {"url": "http://127.0.0.1/", "events": ["WEBHOOK_EVENT_DONE"]},
    }
    answer = httpx.post(f"{controller.http}/v1/jobs", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["field"].startswith("webhook.events")


@pytest.fixture(scope="module")
def strict(log_dir: Path) -> Iterator[Controller]:
    """A controller without --webhook-allow: loopback and private addresses are refused."""
    daemon = Controller(log_dir, http=True).start()
    yield daemon
    daemon.stop()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost/hook",
        "https://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/hook",
        "http://0.0.0.0/hook",
    ],
)
def test_loopback_and_private_addresses_are_refused_without_allow(strict: Controller, url: str) -> None:
    with strict.client() as client, pytest.raises(errors.InvalidRequest) as caught:
        client.submit(model="null", prompt="x", webhook=url)
    assert caught.value.field == "webhook.url"
    assert "--webhook-allow" in str(caught.value)
    answer = httpx.post(
        f"{strict.http}/v1/generate", json={"model": "null", "prompt": "x", "webhook": {"url": url}}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["field"] == "webhook.url"
    with strict.client() as client:
        assert client.list_jobs() == []  # nothing was queued


def test_two_controllers_on_one_redis_deliver_each_event_once(
    log_dir: Path, user_catalog: Path, model_dir: Path, redis_server: RedisServer, receiver: Receiver
) -> None:
    store = ("--store", redis_server.url, "--catalog", str(user_catalog), *ALLOW)
    store += ("--webhook-base-url", "https://omnirt.example.com/")
    first = Controller(log_dir, *store).start()
    second = Controller(log_dir, *store).start()
    worker = Worker(log_dir, first.address, "w-redis-hooks", model_dir, "--models", "null").start()
    try:
        first.wait_worker("w-redis-hooks")
        jobs = []
        for i, daemon in enumerate((first, second, first, second)):
            with daemon.client() as c:
                path = "/flaky/redis" if i == 3 else "/ok/redis"
                jobs.append(c.submit(model="null", prompt=f"x{i}", webhook=receiver.url(f"{path}/{i}")))
        with second.client() as c:
            secret = c.webhook_secret()
            for job in jobs:
                c.wait(job.id, timeout=60)
        with first.client() as c:
            assert c.webhook_secret() == secret  # both sign with the one secret

        def all_completed() -> bool:
            done = [d for d in receiver.got("/") if "redis" in d.path and d.status < 300]
            return sum(d.payload["type"] == "job.completed" for d in done) == len(jobs)

        wait_for(all_completed, 30, "every job's completed event")
        time.sleep(1)  # room for a duplicate to show up
        got = [d for d in receiver.got("/") if "redis" in d.path]
        ok = [d for d in got if d.status < 300]
        assert len({d.id for d in ok}) == len(ok), "an event was delivered twice"
        for i, job in enumerate(jobs):
            mine = [verify(d, secret) for d in ok if d.path.endswith(f"/{i}")]
            types = [p["type"] for p in mine]
            assert types[0] == "job.queued" and types[1] == "job.started" and types[-1] == "job.completed"
            assert {p["data"]["id"] for p in mine} == {job.id}
            link = mine[-1]["data"]["result"]["artifacts"][0]["uri"]
            assert link == f"https://omnirt.example.com/v1/jobs/{job.id}/artifacts/0"
            with second.client() as c:
                assert c.get_job(job.id).webhook is not None  # kept with the job in Redis
        # The flaky receiver: every event three times, with one id each.
        flaky = [d for d in got if d.path == "/flaky/redis/3"]
        assert {sum(1 for d in flaky if d.id == i) for i in {d.id for d in flaky}} == {3}
    finally:
        worker.stop()
        first.stop()
        second.stop()


def test_each_tenant_has_its_own_secret_and_reads_only_its_own(
    log_dir: Path, tmp_path: Path, user_catalog: Path, receiver: Receiver
) -> None:
    lines = []
    for tenant, key, role in (
        ("alice", "alice-key", "user"),
        ("bob", "bob-key", "user"),
        ("ops", "ops-key", "admin"),
    ):
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{role}"', f'sha256 = "{key_digest(key)}"', ""]
    keys = tmp_path / "keys.toml"
    keys.write_text("\n".join(lines))
    master = tmp_path / "master"
    master.write_text("a-master-secret-of-enough-bytes\n")
    args = (
        "--auth-keys",
        str(keys),
        "--webhook-secret-file",
        str(master),
        "--catalog",
        str(user_catalog),
        *ALLOW,
    )
    daemon = Controller(log_dir, *args, http=True, api_key="ops-key").start()
    try:
        with daemon.client(api_key="alice-key") as alice, daemon.client(api_key="bob-key") as bob:
            secret_a, secret_b = alice.webhook_secret(), bob.webhook_secret()
            assert secret_a != secret_b
            with pytest.raises(errors.PermissionDenied):
                alice.webhook_secret("bob")
            with daemon.client() as ops:
                assert ops.webhook_secret("bob") == secret_b
                with pytest.raises(errors.InvalidRequest) as caught:
                    ops.webhook_secret("x" * 100)
                assert caught.value.field == "tenant"
            http = httpx.get(f"{daemon.http}/v1/webhooks/secret", headers={"Authorization": "Bearer bob-key"})
            assert http.json() == {"secret": secret_b, "tenant": "bob"}
            assert httpx.get(f"{daemon.http}/v1/webhooks/secret").status_code == 401
            # queued-video waits (no worker): cancelling it makes an event at once.
            job = alice.submit(model="queued-video", prompt="x", webhook=receiver.url("/ok/alice"))
            alice.cancel(job.id)
            got = wait_types(receiver, "/ok/alice", "job.cancelled")
            assert verify(got[-1], secret_a)["data"]["tenant"] == "alice"
            with pytest.raises(WebhookVerificationError):
                verify(got[-1], secret_b)
        # The same master file gives a restarted controller the same secrets.
        daemon.stop()
        daemon = Controller(log_dir, *args, api_key="ops-key").start()
        with daemon.client() as ops:
            assert ops.webhook_secret("alice") == secret_a
    finally:
        daemon.stop()


def test_a_dead_controllers_deliveries_are_taken_over(
    log_dir: Path, user_catalog: Path, redis_server: RedisServer, receiver: Receiver
) -> None:
    # A long retry window and a slow backoff: the first controller is still retrying when it dies.
    store = ("--store", redis_server.url, "--catalog", str(user_catalog), "--webhook-allow", "127.0.0.1/32")
    slow = ("--webhook-backoff-s", "2", "--webhook-retry-s", "60", "--webhook-lease-s", "1")
    first = Controller(log_dir, *store, *slow).start()
    second: Controller | None = None
    try:
        with first.client() as c:
            hook = receiver.url("/flaky/takeover")
            job = c.submit(model="queued-video", prompt="x", webhook=hook, webhook_events=["cancelled"])
            c.cancel(job.id)
        wait_for(lambda: len(receiver.got("/flaky/takeover")) == 1, 20, "the first attempt")
        first.signal(signal.SIGKILL)  # no goodbye: its lease runs out
        first.wait(10)
        second = Controller(log_dir, *store, *FAST_RETRIES[:2], "--webhook-lease-s", "1").start()
        wait_for(lambda: any(d.status == 200 for d in receiver.got("/flaky/takeover")), 30, "the takeover")
        got = receiver.got("/flaky/takeover")
        assert [d.status for d in got] == [500, 500, 200]
        assert len({d.id for d in got}) == 1
        assert got[-1].payload["data"]["id"] == job.id
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_openai_routes_take_webhook_and_webhook_events(
    client: omnirt.Client, controller: Controller, receiver: Receiver
) -> None:
    body = {
        "model": "null",
        "prompt": "x",
        "webhook": receiver.url("/ok/openai"),
        "webhook_events": "completed",
    }
    answer = httpx.post(f"{controller.http}/v1/images/generations", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    got = wait_types(receiver, "/ok/openai", "job.completed")
    assert [d.payload["type"] for d in got] == ["job.completed"]
    video = {"model": "queued-video", "prompt": "x", "webhook": receiver.url("/ok/videos")}
    job = httpx.post(f"{controller.http}/v1/videos", json=video, timeout=60).json()
    wait_types(receiver, "/ok/videos", "job.queued")
    client.cancel(job["id"])
    wait_types(receiver, "/ok/videos", "job.cancelled")
    for fields, param in (
        ({"webhook": "ftp://x/y"}, "webhook.url"),
        ({"webhook": receiver.url("/ok/x"), "webhook_events": ["done"]}, "webhook_events"),
        ({"webhook": "", "webhook_events": ["completed"]}, "webhook_events"),
    ):
        refused = httpx.post(f"{controller.http}/v1/images/generations", json={**body, **fields}, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param, refused.text


def test_a_stopped_controller_hands_its_deliveries_over_at_once(
    log_dir: Path, user_catalog: Path, redis_server: RedisServer, receiver: Receiver
) -> None:
    # A lease far longer than the test: only the release on SIGTERM lets the second one take over.
    store = ("--store", redis_server.url, "--catalog", str(user_catalog), "--webhook-allow", "127.0.0.1/32")
    long_lease = ("--webhook-lease-s", "300", "--webhook-retry-s", "600")
    first = Controller(log_dir, *store, *long_lease, "--webhook-backoff-s", "30").start()
    second: Controller | None = None
    try:
        with first.client() as c:
            hook = receiver.url("/flaky/handover")
            job = c.submit(model="queued-video", prompt="x", webhook=hook, webhook_events=["cancelled"])
            c.cancel(job.id)
        wait_for(lambda: len(receiver.got("/flaky/handover")) == 1, 20, "the first attempt")
        assert first.stop() == 0
        second = Controller(log_dir, *store, *long_lease, "--webhook-backoff-s", "0.05").start()
        wait_for(lambda: any(d.status == 200 for d in receiver.got("/flaky/handover")), 20, "the handover")
        assert len({d.id for d in receiver.got("/flaky/handover")}) == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_an_idempotent_resubmission_delivers_nothing_twice(client: omnirt.Client, receiver: Receiver) -> None:
    hook = receiver.url("/ok/idem")
    fields: dict[str, Any] = {
        "model": "queued-video",
        "prompt": "x",
        "webhook": hook,
        "idempotency_key": "idem-1",
    }
    first, again = client.submit(**fields), client.submit(**fields)
    assert again.id == first.id
    with pytest.raises(errors.InvalidRequest) as caught:
        client.submit(**{**fields, "webhook": receiver.url("/ok/other")})
    assert caught.value.field == "idempotency_key"
    client.cancel(first.id)
    wait_types(receiver, "/ok/idem", "job.cancelled")
    time.sleep(0.5)  # room for a second follower's duplicates to show up
    assert [d.payload["type"] for d in receiver.got("/ok/idem")] == ["job.queued", "job.cancelled"]
