"""A job's events in its Redis stream `P events:ID`: several to an entry, read back one by one.

Every event has its own sequence number, and the entry that holds it is found by it: an
entry's id is `0-N`, N the sequence of the *last* event it holds. One event (the QUEUED one, a
requeue's, a cancel's) is one entry, as it always was: field `e`, the `JobEvent` proto. Several
written together (a run's events gathered by `RunEventBuffer`, or those a job's FINISH logs:
the run's last events, RESULT, the final state) are one entry too, one XADD instead of one per
event:

    e    the last event (so a reader from before packing, which reads `e` of each entry at the
         entry's id, still sees every final state and every entry's last event at its sequence)
    m    the events before it, each as a 4-byte big-endian length and its `JobEvent` proto; the
         first has the sequence N - count(m), the next one more, and so on
    r    (optional) the index in `m` of the RESULT event whose result was left out: it is the
         job hash's `result`, the same bytes, kept once instead of twice

Reading after sequence S takes the entries whose id is above S (every entry that holds an event
after S) and drops the events at or below S.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from omnirt._internal import convert as c
from omnirt.types import EventKind, JobEvent
from omnirt.v1 import types_pb2

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True)
class Packed:
    """Events ready for one stream entry: the script's arguments `count, last, packed, result`."""

    count: int
    last: bytes = b""
    packed: bytes = b""
    result_index: str = ""  # the index in `packed` of the RESULT event without its result, or ""

    @property
    def args(self) -> list[int | bytes | str]:
        return [self.count, self.last, self.packed, self.result_index]


NOTHING = Packed(0)


def pack(events: Sequence[JobEvent]) -> Packed:
    """`events` (in order) for one entry. A RESULT event before the last goes without its result,
    which the job hash holds (only a FINISH, which stores that result, logs a RESULT event)."""
    if not events:
        return NOTHING
    *before, last = events
    parts, result_index = [], ""
    for i, event in enumerate(before):
        if event.kind is EventKind.RESULT and not result_index:
            proto = c.event_to_proto(replace(event, result=None))  # not converted to be dropped
            proto.result.SetInParent()  # still a RESULT event (the `kind` oneof), without the bytes
            result_index = str(i)
        else:
            proto = c.event_to_proto(event)
        data = proto.SerializeToString()
        parts.append(_LENGTH.pack(len(data)) + data)
    return Packed(len(events), c.event_to_proto(last).SerializeToString(), b"".join(parts), result_index)


def _split(packed: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(packed):
        (size,) = _LENGTH.unpack_from(packed, at)
        at += _LENGTH.size
        out.append(packed[at : at + size])
        at += size
    return out


async def read_entries(
    entries: list[tuple[bytes, dict[bytes, bytes]]],
    after: int,
    job_result: Callable[[], Awaitable[bytes | None]],
) -> list[JobEvent]:
    """The events of XRANGE `entries` with a sequence above `after`, in order; `job_result()`
    reads the job hash's `result` for a RESULT event stored without it."""
    out = []
    for entry_id, fields in entries:
        last_seq = int(entry_id.split(b"-")[1])
        protos = _split(fields.get(b"m", b""))
        result_at = int(fields[b"r"]) if b"r" in fields else -1
        protos.append(fields[b"e"])
        first_seq = last_seq - len(protos) + 1
        for i, data in enumerate(protos):
            seq = first_seq + i
            if seq <= after:
                continue
            proto = types_pb2.JobEvent.FromString(data)
            if i == result_at:
                result = await job_result()
                if result:
                    proto.result.ParseFromString(result)
            event = c.event_from_proto(proto)
            event.sequence = seq
            out.append(event)
    return out
