"""Tenants on the Redis store: two controllers on one real `redis-server`, with `--auth-keys`,
real `null` workers, clients with API keys. Each controller must agree on who owns a job (also
after a restart), share one max_queued count and one rate bucket per tenant, and share the
queue fairly between tenants.
"""

from __future__ import annotations

import functools
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import omnirt
from omnirt import errors
from omnirt.controller.edges.auth import key_digest
from omnirt.types import JobState
from tests.daemons import Controller, RedisServer, Worker, wait_for

KEYS = {
    "alice": "alice-key-7",
    "bob": "bob-key-7",
    "carol": "carol-key-7",
    "dave": "dave-key-7",
    "ops": "ops-key-7",
}
QUOTAS = {"carol": "max_queued = 4", "dave": "rate_per_s = 1\nburst = 2"}
UNKNOWN = "job-00000000000000ff"


@pytest.fixture
def redis_server(log_dir: Path) -> Iterator[RedisServer]:
    server = RedisServer(log_dir).start()
    yield server
    server.stop()


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    lines = []
    for tenant, key in KEYS.items():
        role = "admin" if tenant == "ops" else "user"
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{role}"', f'sha256 = "{key_digest(key)}"']
        lines += [QUOTAS.get(tenant, ""), ""]
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(lines))
    return path


def controller(
    log_dir: Path, redis_server: RedisServer, keys: Path, *extra: str, port: int | None = None
) -> Controller:
    flags = ("--store", redis_server.url, "--auth-keys", str(keys), *extra)
    return Controller(log_dir, *flags, port=port, api_key=KEYS["ops"]).start()


def null_worker(log_dir: Path, model_dir: Path, on: Controller, worker_id: str, *extra: str) -> Worker:
    worker = Worker(log_dir, on.address, worker_id, model_dir, "--models", "null", *extra).start()
    on.wait_worker(worker_id)
    return worker


def client(on: Controller, tenant: str) -> omnirt.Client:
    return on.client(api_key=KEYS[tenant], timeout=30)


def same_words(error: errors.OmniRTError, job_id: str) -> str:
    return error.message.replace(job_id, "ID")


def test_every_controller_of_one_redis_and_a_restarted_one_keep_each_tenants_jobs_its_own(
    redis_server: RedisServer, keys: Path, log_dir: Path, model_dir: Path
) -> None:
    a = controller(log_dir, redis_server, keys, "--inline-limit-bytes", "1")
    b = controller(log_dir, redis_server, keys, "--inline-limit-bytes", "1")
    worker = null_worker(log_dir, model_dir, a, "w-tenants")
    try:
        with client(a, "alice") as alice_a, client(b, "alice") as alice_b:
            job = alice_a.submit(model="null", prompt="alice's secret", idempotency_key="k1")
            result = alice_b.wait(job.id, timeout=60)
            assert result.report.tenant == "alice", "the RunReport names the owner"
            assert alice_b.get_job(job.id).tenant == "alice"
            assert alice_b.download_artifact(job.id, 0)
            assert alice_b.submit(model="null", prompt="alice's secret", idempotency_key="k1").id == job.id
        with client(a, "bob") as bob_a, client(b, "bob") as bob_b:
            for bob in (bob_a, bob_b):
                with pytest.raises(errors.JobNotFound) as unknown:
                    bob.get_job(UNKNOWN)
                calls: list[Callable[[], object]] = [
                    functools.partial(bob.get_job, job.id),
                    functools.partial(bob.cancel, job.id),
                    functools.partial(lambda c: list(c.watch(job.id)), bob),
                    functools.partial(bob.download_artifact, job.id, 0),
                ]
                for call in calls:
                    with pytest.raises(errors.JobNotFound) as foreign:
                        call()
                    assert same_words(foreign.value, job.id) == same_words(unknown.value, UNKNOWN)
                assert job.id not in {j.id for j in bob.list_jobs()}
            # The same idempotency key from another tenant is another job.
            bobs = bob_b.submit(model="null", prompt="alice's secret", idempotency_key="k1")
            assert bobs.id != job.id and bobs.tenant == "bob"
            bob_a.wait(bobs.id, timeout=60)
            assert [j.id for j in bob_a.list_jobs()] == [bobs.id]
        with b.client() as ops:
            assert {j.id: j.tenant for j in ops.list_jobs()} == {job.id: "alice", bobs.id: "bob"}

        # A restarted controller reads the owners from Redis.
        b.stop()
        b = controller(log_dir, redis_server, keys, port=b.port)
        with client(b, "alice") as alice_b, client(b, "bob") as bob_b:
            assert alice_b.get_job(job.id).tenant == "alice"
            assert [j.id for j in alice_b.list_jobs()] == [job.id]
            with pytest.raises(errors.JobNotFound):
                bob_b.get_job(job.id)
            assert [j.id for j in bob_b.list_jobs()] == [bobs.id]
    finally:
        worker.stop()
        a.stop()
        b.stop()


def active_gauge(on: Controller, tenant: str) -> float:
    text = httpx.get(on.http + "/metrics", timeout=5).text
    match = re.search(rf'^omnirt_tenant_active_jobs{{tenant="{tenant}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else -1.0


def refused(submit: Callable[[], object]) -> errors.OmniRTError:
    """The RESOURCE_EXHAUSTED error `submit` must raise."""
    with pytest.raises(errors.QueueFull) as info:
        submit()
    return info.value


def test_max_queued_is_one_count_across_controllers_and_returns_to_zero_every_way_a_job_ends(
    redis_server: RedisServer, keys: Path, log_dir: Path, model_dir: Path
) -> None:
    lease = ("--lease-timeout-ms", "1500")
    a = controller(log_dir, redis_server, keys, *lease, "--max-attempts", "3")
    b = Controller(
        log_dir,
        "--store",
        redis_server.url,
        "--auth-keys",
        str(keys),
        *lease,
        "--max-attempts",
        "3",
        http=True,
        api_key=KEYS["ops"],
    ).start()
    workers: list[Worker] = []
    slow = {"num_inference_steps": 40, "extra": {"sleep_ms_per_step": 50}}
    try:
        with client(a, "carol") as on_a, client(b, "carol") as on_b:
            jobs = [on_a.submit(model="null", prompt=f"a{i}", **slow) for i in range(2)]
            jobs += [on_b.submit(model="null", prompt=f"b{i}", **slow) for i in range(2)]
            words = "tenant 'carol' has 4 jobs queued or running (max_queued 4); retry when one finishes"
            for on in (on_a, on_b):
                error = refused(functools.partial(on.submit, model="null", prompt="one too many"))
                assert isinstance(error, errors.QuotaExceeded) or error.code.name == "RESOURCE_EXHAUSTED"
                assert error.message == words and error.retry_after_s == 1.0
            with client(a, "alice") as alice:
                alice.submit(model="null", prompt="another tenant is not counted with carol")
            wait_for(lambda: active_gauge(b, "carol") == 4, 10, "the active gauge at 4")

            # Cancelled (through the other controller).
            assert on_b.cancel(jobs[0].id).cancelled
            jobs[0] = on_a.submit(model="null", prompt="after a cancel", **slow)
            refused(lambda: on_b.submit(model="null", prompt="full again"))
            # Expired: a deadline that passes while queued.
            on_b.cancel(jobs[1].id)
            jobs[1] = on_b.submit(model="null", prompt="expires", timeout_ms=500)
            wait_for(lambda: on_a.get_job(jobs[1].id).state is JobState.FAILED, 20, "the deadline")
            jobs[1] = on_a.submit(model="null", prompt="after an expiry", **slow)
            refused(lambda: on_a.submit(model="null", prompt="full again"))

            # A worker lost while it runs carol's jobs: they are requeued (still counted) and
            # finished by the next one.
            workers.append(null_worker(log_dir, model_dir, a, "w-lost", "--slots", "4"))
            wait_for(lambda: on_a.get_job(jobs[0].id).state is JobState.RUNNING, 30, "a job to run")
            workers[0].signal(signal.SIGKILL)
            workers[0].wait(10)
            wait_for(
                lambda: any(
                    on_b.get_job(j.id).attempts >= 1 and on_b.get_job(j.id).state is JobState.QUEUED
                    for j in jobs
                ),
                30,
                "a job requeued after its worker was lost",
            )
            refused(lambda: on_b.submit(model="null", prompt="requeued jobs still count"))
            workers.append(null_worker(log_dir, model_dir, b, "w-next", "--slots", "4"))
            for j in jobs:
                on_a.wait(j.id, timeout=90)
            assert any(on_a.get_job(j.id).attempts == 2 for j in jobs), "one ran twice"

            # All ended: carol has her four again, on either controller, and the gauge says 0.
            wait_for(lambda: active_gauge(b, "carol") == 0, 10, "the active gauge back at 0")
            again = [on_b.submit(model="null", prompt=f"again {i}", **slow) for i in range(2)]
            again += [on_a.submit(model="null", prompt=f"again {i}", **slow) for i in range(2)]
            refused(lambda: on_a.submit(model="null", prompt="one too many again"))
            for j in again:
                on_b.wait(j.id, timeout=60)
    finally:
        for worker in workers:
            if worker.alive():
                worker.stop()
        a.stop()
        b.stop()


def test_a_tenants_rate_bucket_is_shared_by_every_controller(
    redis_server: RedisServer, keys: Path, log_dir: Path
) -> None:
    a = controller(log_dir, redis_server, keys)
    b = controller(log_dir, redis_server, keys)
    try:
        with client(a, "dave") as on_a, client(b, "dave") as on_b:
            on_a.submit(model="null", prompt="1")
            on_b.submit(model="null", prompt="2")  # the burst of 2 is spent, across both
            error = refused(lambda: on_b.submit(model="null", prompt="3"))
            refused_at = time.monotonic()
            assert "over its rate limit (1 jobs/s, burst 2)" in error.message
            assert error.retry_after_s is not None and 0 < error.retry_after_s <= 1.0
            refused(lambda: on_a.submit(model="null", prompt="3"))
            time.sleep(max(0.0, error.retry_after_s - (time.monotonic() - refused_at)) + 0.05)
            on_a.submit(model="null", prompt="3: a token came back")
            refused(lambda: on_b.submit(model="null", prompt="4"))
            with client(b, "bob") as bob:
                for i in range(5):
                    bob.submit(model="null", prompt=f"bob has no rate limit {i}")
    finally:
        a.stop()
        b.stop()


def test_one_tenants_flood_does_not_hold_back_another_tenants_job(
    redis_server: RedisServer, keys: Path, log_dir: Path, model_dir: Path
) -> None:
    """One worker slot, alice floods 20 jobs through one controller, bob sends one through the
    other: bob's job runs after about one of alice's (FIFO would put it after all 20)."""
    flags = ("--max-batch-size", "1")
    a = controller(log_dir, redis_server, keys, *flags)
    b = controller(log_dir, redis_server, keys, *flags)
    worker = null_worker(log_dir, model_dir, b, "w-fair", "--slots", "1")
    job = {"num_inference_steps": 4, "extra": {"sleep_ms_per_step": 50}}
    try:
        with client(a, "alice") as alice, client(b, "bob") as bob:
            flood = [alice.submit(model="null", prompt=f"flood {i}", **job) for i in range(20)]
            wait_for(
                lambda: alice.get_job(flood[0].id).state is not JobState.QUEUED, 30, "the flood to start"
            )
            single = bob.submit(model="null", prompt="bob's one job", **job)
            bob.wait(single.id, timeout=60)
            started = bob.get_job(single.id).started_at
            assert started is not None
            before = [j for j in flood if (s := alice.get_job(j.id).started_at) is not None and s < started]
            assert len(before) <= 3, f"bob's job waited for {len(before)} of alice's 20"
            # alice's own jobs stay in order.
            for j in flood:
                alice.wait(j.id, timeout=60)
            starts = [alice.get_job(j.id).started_at for j in flood]
            assert starts == sorted(starts), "a tenant's jobs run first in, first out"
    finally:
        worker.stop()
        a.stop()
        b.stop()
