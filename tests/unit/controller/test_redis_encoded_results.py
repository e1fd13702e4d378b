"""The Redis engine's encoded results (`core.encoded`): a result as it came is taken by its own
assignment only, and a `Generate` gets stored bytes only for the very job FINISH answered, once."""

from __future__ import annotations

from omnirt.controller.engines.redis.results import EncodedResults
from omnirt.types import GenerateResult, Job, JobState
from omnirt.v1 import types_pb2


class Wire:
    def keeps(self, result: GenerateResult) -> bool:
        return True

    def stamped(self, job_id: str, trace_id: str, tenant: str) -> bytes:
        return job_id.encode()


def job(job_id: str) -> Job:
    return Job(id=job_id, model="null", state=JobState.SUCCEEDED, result=GenerateResult(job_id=job_id))


def test_a_result_as_it_came_goes_to_its_own_assignment_while_it_arrives() -> None:
    encodings, wire = EncodedResults(), Wire()
    with encodings.arriving("j1", "as-1", wire):
        assert encodings.take_arriving("j1", "as-0") is None  # a late result of an older assignment
    with encodings.arriving("j1", "as-1", wire):
        assert encodings.take_arriving("j1", "as-1") is wire
        assert encodings.take_arriving("j1", "as-1") is None, "taken once"
    assert encodings.take_arriving("j1", "as-1") is None, "gone once the engine took the result"


def test_stored_bytes_answer_the_answered_job_once_and_the_newest_are_kept() -> None:
    encodings = EncodedResults(keep=2)
    answered, stored = job("j1"), types_pb2.GenerateResult(job_id="j1").SerializeToString()
    encodings.answered(answered, stored)
    assert encodings.encoded(job("j1")) is None, "another object of the same id (read again) is converted"
    encodings.answered(answered, stored)
    encoded = encodings.encoded(answered)
    assert encoded is not None and encoded.result == stored
    assert types_pb2.Job.FromString(encoded.job).id == "j1" and not types_pb2.Job.FromString(
        encoded.job
    ).HasField("result")
    assert encodings.encoded(answered) is None, "once"
    jobs = [job(f"k{i}") for i in range(3)]
    for j in jobs:
        encodings.answered(j, b"")
    assert encodings.encoded(jobs[0]) is None, "beyond `keep`, the oldest (its caller left) went"
