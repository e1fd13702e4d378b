"""The converters' fast paths give exactly what protobuf's own helpers give."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from omnirt import types as t
from omnirt._internal import convert as c
from omnirt.v1 import cluster_pb2, types_pb2

STRUCTS = [
    {},
    {"width": 64, "prompt": "x", "flag": False, "none": None},
    {
        "extra": {"runtime": {"dtype": "float16", "steps": [1, 2.5, {"deep": [None, True]}]}},
        "empty": {},
        "list": [],
    },
]


@pytest.mark.parametrize("data", STRUCTS)
def test_structs_read_back_like_message_to_dict(data: dict[str, object]) -> None:
    msg = c.struct_from_dict(data)
    assert c.dict_from_struct(msg) == (json_format.MessageToDict(msg) if msg.fields else {})


def test_a_struct_with_infinity_is_refused_like_message_to_dict() -> None:
    msg = struct_pb2.Struct()
    msg.update({"x": float("inf")})
    with pytest.raises(ValueError, match="Infinity"):
        c.dict_from_struct(msg)


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 11, 29, 20, 1, 2, 345678, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2024, 2, 29, 12, 0, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
        datetime(2024, 6, 1, 8, 30, 15, 5),  # naive: local time
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_timestamps_match_protobuf_both_ways(value: datetime) -> None:
    ours, theirs = timestamp_pb2.Timestamp(), timestamp_pb2.Timestamp()
    c.ts_to_proto(value, ours)
    theirs.FromDatetime(value.astimezone(UTC))
    assert (ours.seconds, ours.nanos) == (theirs.seconds, theirs.nanos)
    job = types_pb2.Job()
    job.created_at.CopyFrom(ours)
    back = c.ts_from_proto(job, "created_at")
    assert back == theirs.ToDatetime(tzinfo=UTC) and back is not None and back.tzinfo is UTC
    assert c.ts_from_proto(types_pb2.Job(), "created_at") is None


def test_an_invalid_timestamp_is_still_refused() -> None:
    job = types_pb2.Job()
    job.created_at.nanos = -1
    with pytest.raises(ValueError):
        c.ts_from_proto(job, "created_at")


def test_enums_map_both_ways_and_unknown_numbers_are_none() -> None:
    for task in t.Task:
        assert c.task_from_proto(c.task_to_proto(task)) is task
        assert c.task_to_proto(task.value) == c.task_to_proto(task)
    for state in t.JobState:
        assert c.state_from_proto(c.state_to_proto(state)) is state
    for ws in t.WorkerState:
        number = c.enum_to_proto(cluster_pb2.WorkerState, "WORKER_STATE_", ws)
        assert cluster_pb2.WorkerState.Name(number) == "WORKER_STATE_" + ws.name
    assert c.task_to_proto(None) == 0 and c.task_from_proto(0) is None and c.task_from_proto(9999) is None
    assert c.state_from_proto(0) is None and c.state_from_proto(9999) is None
    with pytest.raises(ValueError):
        c.task_to_proto("not-a-task")


def test_a_job_without_its_result_leaves_only_the_result_out() -> None:
    result = t.GenerateResult(
        job_id="j", artifacts=[t.Artifact(index=0, kind=t.MediaKind.IMAGE, mime_type="image/png", data=b"x")]
    )
    job = t.Job(id="j", state=t.JobState.SUCCEEDED, model="m", result=result)
    full, bare = c.job_to_proto(job), c.job_to_proto(job, with_result=False)
    assert full.HasField("result") and not bare.HasField("result")
    full.ClearField("result")
    assert full == bare
