"""A rolling upgrade on Redis: the records an older controller wrote are this controller's jobs.

`tests/fixtures/redis-89a9a0f.json` holds every Redis key the controller of 89a9a0f (before the
house's second pass) left after a succeeded, a failed, a cancelled and a still-queued job
(`tests/fixtures/redis_records.py` made it). Loaded into an empty real redis-server, they are
read by this checkout's controller as a user would: each job's state, result, events and
artifacts, the listing, the idempotency key; and the queued job runs once a worker connects.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import omnirt
from tests.daemons import Controller, RedisServer, Worker

Upgraded = tuple[Controller, dict[str, str], Path]  # the controller, the fixture's job ids, a log dir
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "redis-89a9a0f.json"
# The fixture's jobs ended in December 2026: a listing sweep must not take them for expired.
TEN_YEARS_S = str(10 * 365 * 86400)


def load(client: redis.Redis, keys: dict[str, Any]) -> None:
    """Write the dumped keys back, by type (TTLs as they were when dumped)."""
    raw = base64.b64decode
    for name, entry in keys.items():
        key, kind, value = raw(name), entry["type"], entry["value"]
        if kind == "string":
            client.set(key, raw(value))
        elif kind == "hash":
            client.hset(key, mapping={raw(k): raw(v) for k, v in value.items()})
        elif kind == "zset":
            client.zadd(key, {raw(member): score for member, score in value})
        elif kind == "set":
            client.sadd(key, *(raw(member) for member in value))
        elif kind == "list":
            client.rpush(key, *(raw(item) for item in value))
        elif kind == "stream":
            for entry_id, fields in value:
                client.xadd(key, {raw(k): raw(v) for k, v in fields.items()}, id=entry_id)
        if entry["pttl_ms"]:
            client.pexpire(key, entry["pttl_ms"])


@pytest.fixture(scope="module")
def upgraded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upgraded]:
    log_dir = tmp_path_factory.mktemp("upgrade")
    document = json.loads(FIXTURE.read_text())
    server = RedisServer(log_dir).start()
    load(redis.Redis.from_url(server.url), document["keys"])
    controller = Controller(log_dir, "--store", server.url, "--job-ttl-s", TEN_YEARS_S).start()
    try:
        yield controller, document["jobs"], log_dir
    finally:
        controller.stop()
        server.stop()


def test_finished_jobs_read_as_they_ended(upgraded: Upgraded) -> None:
    controller, jobs, _ = upgraded
    with controller.client() as client:
        done = client.get_job(jobs["succeeded"])
        assert done.state is omnirt.JobState.SUCCEEDED and done.labels == {"run": "upgrade"}
        result = client.wait(done.id, timeout=10)
        assert [a.seed for a in result.artifacts] == [7, 8]
        assert result.report is not None and result.report.execution_mode == "legacy_call"
        stored = client.download_artifact(done.id, 1)
        assert stored[:8] == b"\x89PNG\r\n\x1a\n"
        failed = client.get_job(jobs["failed"])
        assert failed.state is omnirt.JobState.FAILED and failed.error is not None
        assert (failed.error.code, failed.error.field) == ("INVALID_ARGUMENT", "extra.bogus")
        cancelled = client.get_job(jobs["cancelled"])
        assert cancelled.state is omnirt.JobState.CANCELLED
        listed = {job.id for job in client.list_jobs()}
        assert set(jobs.values()) <= listed


def test_an_old_jobs_events_replay_in_order(upgraded: Upgraded) -> None:
    controller, jobs, _ = upgraded
    with controller.client() as client:
        events = list(client.watch(jobs["succeeded"], timeout=10))
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert events[-1].kind is omnirt.EventKind.STATE and events[-1].state is omnirt.JobState.SUCCEEDED
    assert any(e.kind is omnirt.EventKind.RESULT for e in events)


def test_an_old_idempotency_key_still_names_its_job(
    upgraded: tuple[Controller, dict[str, str], Path],
) -> None:
    controller, jobs, _ = upgraded
    with controller.client() as client:
        again = client.submit(
            model="null", prompt="a red fox", seed=7, num_outputs=2, labels={"run": "upgrade"},
            idempotency_key="upgrade-1",
        )  # fmt: skip
    assert again.id == jobs["succeeded"]


def test_the_old_queued_job_runs_on_a_new_worker(upgraded: Upgraded) -> None:
    controller, jobs, log_dir = upgraded
    with controller.client() as client:
        assert client.get_job(jobs["queued"]).state is omnirt.JobState.QUEUED
        worker = Worker(log_dir, controller.address, "w-new", log_dir / "models", "--models", "null").start()
        try:
            result = client.wait(jobs["queued"], timeout=60)
        finally:
            worker.stop()
    assert result.job_id == jobs["queued"] and [a.seed for a in result.artifacts] == [11]
    assert result.report is not None and result.report.config_resolved["num_inference_steps"] == 3
