"""Encoded jobs and results, as the edges and the stores pass them on without protobuf here.

A finished job's result is the largest thing a Generate answers (a video, many MiB). Converting
it from the worker's message to a dataclass and back for every answer and for the store costs
copies of every artifact's bytes. So the edge hands the engine the worker's result as it came
(`ResultEncoding`, implemented by `edges.convert.WireResult`); the memory store keeps those
bytes instead of converting the result back (as the client's view, or as the full result when
an artifact's bytes were cut from the view); and Generate answers from the store's bytes
(`EncodedJobs`) instead of converting the job again. The engine only passes the opaque
encoding along: it never parses or builds a message.
"""

from __future__ import annotations

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
