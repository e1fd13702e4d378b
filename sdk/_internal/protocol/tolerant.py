"""A controller message stream read from raw bytes, one message at a time (the worker's reader).

The worker's Connect call reads raw bytes so that one message it cannot parse (nested deeper
than protobuf decodes, say) costs only its own jobs: each message of a batch is parsed alone,
and of one that fails only the assignment and job ids are read, which never nest.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from omnirt._internal.protocol.convert import unbatched_responses
from omnirt._internal.protocol.v1 import gateway_pb2


def assignment_job_ids(msg: gateway_pb2.ConnectResponse) -> tuple[str, list[str]]:
    """(assignment id, job ids) of an assignment message, read without converting the requests.

    For answering an assignment whose conversion failed.
    """
    if msg.WhichOneof("message") != "assignment":
        return "", []
    return msg.assignment.assignment_id, [item.job_id for item in msg.assignment.items]


@dataclass
class Undecodable:
    """A controller message protobuf could not parse; the assignment and jobs it held, if any."""

    assignment_id: str
    job_ids: list[str]
    reason: str


def controller_messages(data: bytes) -> list[gateway_pb2.ConnectResponse | Undecodable]:
    """The controller messages in one stream message (a batch's, in order) from its wire bytes."""
    out: list[gateway_pb2.ConnectResponse | Undecodable] = []
    try:
        out += unbatched_responses(gateway_pb2.ConnectResponse.FromString(data))
        return out
    except DecodeError as exc:
        reason = str(exc)
    try:
        fields = list(_wire_fields(data))
    except ValueError:
        return [Undecodable("", [], reason)]
    batch = [value for number, value in fields if number == _BATCH_FIELD and isinstance(value, bytes)]
    if not batch:
        return [_undecodable(fields, reason)]
    # A field that occurs more than once is one message merged from all (as protobuf reads it).
    for number, value in _wire_fields_or_empty(b"".join(batch)):
        if number == _BATCH_MESSAGES_FIELD and isinstance(value, bytes):
            try:
                out.append(gateway_pb2.ConnectResponse.FromString(value))
            except DecodeError as exc:
                out.append(_undecodable(_wire_fields_or_empty(value), str(exc)))
    return out


_BATCH_FIELD = gateway_pb2.ConnectResponse.DESCRIPTOR.fields_by_name["batch"].number
_BATCH_MESSAGES_FIELD = gateway_pb2.ConnectResponseBatch.DESCRIPTOR.fields_by_name["messages"].number
_ASSIGNMENT_FIELD = gateway_pb2.ConnectResponse.DESCRIPTOR.fields_by_name["assignment"].number
_ASSIGNMENT_ID_FIELD = gateway_pb2.Assignment.DESCRIPTOR.fields_by_name["assignment_id"].number
_ITEMS_FIELD = gateway_pb2.Assignment.DESCRIPTOR.fields_by_name["items"].number
_JOB_ID_FIELD = gateway_pb2.AssignmentItem.DESCRIPTOR.fields_by_name["job_id"].number


def _undecodable(fields: list[tuple[int, bytes | int]], reason: str) -> Undecodable:
    """The ids of the assignment among a ConnectResponse's wire fields (none for another kind)."""
    assignment = [
        value for number, value in fields if number == _ASSIGNMENT_FIELD and isinstance(value, bytes)
    ]
    if not assignment:
        return Undecodable("", [], reason)
    assignment_id, job_ids = "", []
    for number, value in _wire_fields_or_empty(b"".join(assignment)):
        if number == _ASSIGNMENT_ID_FIELD and isinstance(value, bytes):
            assignment_id = value.decode("utf-8", "replace")
        elif number == _ITEMS_FIELD and isinstance(value, bytes):
            for inner, item in _wire_fields_or_empty(value):
                if inner == _JOB_ID_FIELD and isinstance(item, bytes):
                    job_ids.append(item.decode("utf-8", "replace"))
    return Undecodable(assignment_id, job_ids, reason)


def _wire_fields_or_empty(data: bytes) -> list[tuple[int, bytes | int]]:
    try:
        return list(_wire_fields(data))
    except ValueError:
        return []


def _wire_fields(data: bytes) -> Iterator[tuple[int, bytes | int]]:
    """(field number, value) of one message's top-level fields, by protobuf's wire format.

    Varints as ints, length-delimited and fixed-width fields as bytes; ValueError when corrupt.
    """
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = _varint(data, pos)
            yield number, value
            continue
        if wire_type == 2:
            size, pos = _varint(data, pos)
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
        else:  # groups (3, 4) are not in omnirt's protos
            raise ValueError(f"wire type {wire_type}")
        if pos + size > len(data):
            raise ValueError("truncated")
        yield number, data[pos : pos + size]
        pos += size


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ValueError("bad varint")
