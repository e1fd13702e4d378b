"""A job's events on the Redis engine go several to a stream entry (one XADD per write, not one
per event), and read back as before: every event at its own sequence, the RESULT with its
result, a resume from any sequence; and a controller from before packing, which reads one event
per entry, still reads each entry's last event (every final state) at its sequence.

A real `redis-server`, controller and null worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import omnirt
from omnirt._internal.convert import event_from_proto
from omnirt.types import EventKind, JobEvent, JobState
from omnirt.v1 import types_pb2
from tests.daemons import Controller, RedisServer, Worker

PREFIX = "{omnirt}:"


@pytest.fixture(scope="module")
def client(redis_server: RedisServer, log_dir: Path, model_dir: Path) -> Iterator[omnirt.Client]:
    controller = Controller(log_dir, "--store", redis_server.url).start()
    worker = Worker(log_dir, controller.address, "w-log", model_dir, "--models", "null").start()
    controller.wait_worker("w-log")
    try:
        with controller.client(timeout=30) as c:
            yield c
    finally:
        worker.stop()
        controller.stop()


def old_reader(server: RedisServer, job_id: str) -> dict[int, JobEvent]:
    """The events a controller from before packing reads: field `e` of each entry, at its id."""
    with redis.Redis(port=server.port) as r:
        entries = r.xrange(PREFIX + "events:" + job_id)
    return {
        int(eid.split(b"-")[1]): event_from_proto(types_pb2.JobEvent.FromString(f[b"e"]))
        for eid, f in entries
    }


def raw_entries(server: RedisServer, job_id: str) -> list[dict[bytes, bytes]]:
    with redis.Redis(port=server.port) as r:
        return [fields for _, fields in r.xrange(PREFIX + "events:" + job_id)]


def finished_job(client: omnirt.Client, **extra: object) -> tuple[str, list[JobEvent], bytes]:
    job = client.submit(model="null", prompt="an event log", seed=7, **extra)  # type: ignore[arg-type]
    result = client.wait(job.id)
    return job.id, list(client.watch(job.id)), result.artifacts[0].data


def test_a_fast_jobs_events_read_back_one_by_one_from_few_entries(
    client: omnirt.Client, redis_server: RedisServer
) -> None:
    job_id, events, png = finished_job(client, num_inference_steps=2)
    kinds = [e.kind for e in events]
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert kinds[0] is EventKind.STATE and events[0].state is JobState.QUEUED
    assert EventKind.PROGRESS in kinds and kinds.count(EventKind.RESULT) == 1
    assert events[-1].state is JobState.SUCCEEDED
    result = next(e for e in events if e.kind is EventKind.RESULT).result
    assert result is not None and result.artifacts[0].data == png
    entries = raw_entries(redis_server, job_id)
    assert len(entries) < len(events) / 2, "several events to an entry"
    assert not any(png in fields.get(b"m", b"") for fields in entries), "the result is kept once, in the job"
    # Resumed after any sequence: the rest, nothing twice.
    for after in range(len(events)):
        resumed = list(client.watch(job_id, after_sequence=after))
        assert [(e.sequence, e.kind) for e in resumed] == [(e.sequence, e.kind) for e in events[after:]]


def test_a_controller_from_before_packing_reads_each_entrys_last_event_at_its_sequence(
    client: omnirt.Client, redis_server: RedisServer
) -> None:
    # A slower job: its running events are written in several gatherings before its FINISH.
    job_id, events, _ = finished_job(client, num_inference_steps=6, extra={"sleep_ms_per_step": 40})
    by_sequence = {e.sequence: e for e in events}
    old = old_reader(redis_server, job_id)
    assert len(old) > 2, "the run's events came in more than one write"
    for seq, event in old.items():
        assert (event.kind, event.state, event.stage) == (
            by_sequence[seq].kind,
            by_sequence[seq].state,
            by_sequence[seq].stage,
        )
    assert max(old) == events[-1].sequence
    assert old[max(old)].state is JobState.SUCCEEDED, "the final state is every reader's"
