"""Encoded jobs and results, as the edges and the memory store pass them on without protobuf here.

A finished job's result is the largest thing a Generate answers (a video, many MiB). Converting
it from the worker's message to a dataclass and back for every answer and for the store costs
copies of every artifact's bytes. So, beside the engine interface (which sees dataclasses only):

* while the engine takes a worker's result, the worker stream hands the store the result as it
  came (`ArrivingResults.arriving`, with a `ResultEncoding`: `edges.worker_stream.WireResult`), and
  the memory store keeps those bytes when it finishes the job instead of converting the result
  back (as the client's view, or as the full result when an artifact's bytes were cut from it);
* Generate answers from the store's bytes (`EncodedJobs`) instead of converting the job again.

`engines.make_engine` hands both to the server (the memory store is both; on Redis,
`engines.redis.results.EncodedResults`, whose FINISH stores the stamped bytes and whose answered
`Generate` sends them), so nothing probes behind `EngineClient`. The engine interface never sees
an encoding.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

from omnirt.types import GenerateResult, Job


class ResultEncoding(Protocol):
    """A worker's result as it came over the wire (opaque to the engines)."""

    def keeps(self, result: GenerateResult) -> bool:
        """True when `result` (converted from this one) has every artifact as it came: the same
        sizes, and no bytes replaced by a reference."""
        ...

    def stamped(self, job_id: str, trace_id: str, tenant: str) -> bytes:
        """The result encoded (omnirt.v1.GenerateResult) with the controller's job id, trace id
        and tenant in place of the worker's."""
        ...


class ArrivingResults(Protocol):
    """Where the worker stream hands a store a worker's result as it came (the memory store)."""

    def arriving(
        self, job_id: str, assignment_id: str, encoding: ResultEncoding
    ) -> AbstractContextManager[None]:
        """While the engine takes this result: should it finish the job with it (the job still
        runs under `assignment_id`, and its result kept every artifact as it came), the store
        keeps `encoding`'s bytes, stamped with the controller's ids, as the job's result."""
        ...


class EncodedJob(NamedTuple):
    """A final job's bytes: omnirt.v1.Job without its result, and its omnirt.v1.GenerateResult
    as clients see it (None for a job without a result)."""

    job: bytes
    result: bytes | None


class EncodedJobs(Protocol):
    """Where an edge finds a final job already encoded (the memory store's frozen jobs)."""

    def encoded(self, job: Job) -> EncodedJob | None:
        """`job`'s bytes, or None when the store has none (the edge converts `job` then)."""
        ...
