"""Typed errors, one per gRPC status the API uses.

The controller raises these in its domain code and one server interceptor turns them into
a status code, a readable message and trailing metadata (`omnirt-error-field`,
`omnirt-error-fields`, `omnirt-error-subject`, `retry-after-ms`, and the standard
`google.rpc.Status` details in `grpc-status-details-bin`); the SDK turns the status back into the
same class. It reads its own trailers first and the standard details for what they leave out
(another server's errors, and each violation's description).
`map_rpc_error` is what every client call and realtime session raises.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, cast

import grpc

FIELD_KEY = "omnirt-error-field"
# Every field at fault, as a JSON list, when a request broke more than one rule.
FIELDS_KEY = "omnirt-error-fields"
SUBJECT_KEY = "omnirt-error-subject"
RETRY_AFTER_KEY = "retry-after-ms"
STATUS_DETAILS_KEY = "grpc-status-details-bin"


class OmniRTError(Exception):
    """Base class: `code` is the gRPC status, `field` the request field at fault (if any).

    A request that breaks several rules is refused once for all of them: `field` is the first,
    `violations` every one, as (field, description) pairs (`fields`: the fields alone). The
    description is "" where the server sent only the field (a client without
    googleapis-common-protos reads the fields from a trailer, the descriptions from the details).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    subject: str = ""

    def __init__(
        self,
        message: str,
        *,
        field: str = "",
        retry_after_s: float | None = None,
        violations: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        self.violations: list[tuple[str, str]] = list(violations) or ([(field, message)] if field else [])

    @property
    def fields(self) -> list[str]:
        """Every request field at fault, `field` first."""
        return [name for name, _ in self.violations]

    def __str__(self) -> str:
        return f"{self.message} ({self.code.name})"

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """Metadata the server sends with the status so clients can rebuild this error."""
        items = []
        if self.field:
            items.append((FIELD_KEY, self.field))
        if self.subject:
            items.append((SUBJECT_KEY, self.subject))
        if self.retry_after_s is not None:
            items.append((RETRY_AFTER_KEY, str(int(self.retry_after_s * 1000))))
        return tuple(items)


class InvalidRequest(OmniRTError):
    """The request is malformed; `field` names what to fix."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(OmniRTError):
    """Something named in the request does not exist."""

    code = grpc.StatusCode.NOT_FOUND


class ModelNotFound(NotFound):
    """The model is not in the catalog (the message lists close matches)."""

    subject = "model"


class JobNotFound(NotFound):
    """No job has this id (or it expired)."""

    subject = "job"


class WorkerNotFound(NotFound):
    """No connected worker has this id."""

    subject = "worker"


class AlreadyExists(OmniRTError):
    """An idempotency key was reused with a different request."""

    code = grpc.StatusCode.ALREADY_EXISTS


class QueueFull(OmniRTError):
    """The controller's queue is at its bound; retry after `retry_after_s`."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(OmniRTError):
    """The request's deadline passed before it finished."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(OmniRTError):
    """The job was cancelled."""

    code = grpc.StatusCode.CANCELLED


class Unavailable(OmniRTError):
    """The controller (or every worker that could serve) cannot be reached now."""

    code = grpc.StatusCode.UNAVAILABLE


class FailedPrecondition(OmniRTError):
    """The request is valid but cannot run in the current state (e.g. a model fails to load)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ExecutionFailed(OmniRTError):
    """The model raised while running the job."""

    code = grpc.StatusCode.INTERNAL


class Unauthenticated(OmniRTError):
    """Missing or wrong credentials."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(OmniRTError):
    """Valid credentials whose role may not make this call (a user key on an admin RPC)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class QuotaExceeded(QueueFull):
    """The tenant's quota (jobs queued and running) or rate limit is used up; retry later."""


_BY_CODE: dict[grpc.StatusCode, type[OmniRTError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        NotFound,
        AlreadyExists,
        QueueFull,
        DeadlineExceeded,
        Cancelled,
        Unavailable,
        FailedPrecondition,
        ExecutionFailed,
        Unauthenticated,
        PermissionDenied,
    )
}
_BY_SUBJECT: dict[str, type[OmniRTError]] = {
    c.subject: c for c in (ModelNotFound, JobNotFound, WorkerNotFound)
}


def error_for(
    code: grpc.StatusCode | str,
    message: str,
    *,
    field: str = "",
    subject: str = "",
    retry_after_s: float | None = None,
    violations: Sequence[tuple[str, str]] = (),
) -> OmniRTError:
    """Build the typed error for a status code (or its name, as in `JobError.code`)."""
    if isinstance(code, str):
        code = grpc.StatusCode[code] if code in grpc.StatusCode.__members__ else grpc.StatusCode.UNKNOWN
    if code is grpc.StatusCode.OK:  # a failure that calls itself OK (a worker's JobError) is unknown
        code = grpc.StatusCode.UNKNOWN
    cls = _BY_SUBJECT.get(subject) if code is grpc.StatusCode.NOT_FOUND else None
    cls = cls or _BY_CODE.get(code, OmniRTError)
    err = cls(message, field=field, retry_after_s=retry_after_s, violations=violations)
    if cls is OmniRTError:
        err.code = code
    return err


def _from_status_details(data: bytes, violations: list[tuple[str, str]]) -> dict[str, str]:
    """Field, subject and retry hint (as trailer values) from a serialized google.rpc.Status.

    Its BadRequest's violations are added to `violations`.
    """
    try:  # googleapis-common-protos comes with grpcio-status; the base install may lack it
        from google.rpc import error_details_pb2, status_pb2
    except ImportError:
        return {}
    found: dict[str, str] = {}
    try:
        status = status_pb2.Status.FromString(data)
    except Exception:  # a broken trailer must not hide the error itself
        return found
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            for key, name in ((FIELD_KEY, "field"), (SUBJECT_KEY, "subject")):
                if info.metadata.get(name):
                    found.setdefault(key, info.metadata[name])
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                found[FIELD_KEY] = bad.field_violations[0].field
                violations.extend((v.field, v.description) for v in bad.field_violations)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            found[RETRY_AFTER_KEY] = str(retry.retry_delay.ToMilliseconds())
    return found


def from_rpc_error(exc: grpc.RpcError) -> OmniRTError:
    """Map a failed call (sync or aio) to its typed error."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else None) or str(code)
    meta: dict[str, str] = {}
    details: dict[str, str] = {}
    violations: list[tuple[str, str]] = []
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for item in trailing or ():
        key, value = cast(Any, item)  # a _Metadatum (a named pair) or a plain pair
        if key == STATUS_DETAILS_KEY:
            details = _from_status_details(value, violations)
        elif not key.endswith("-bin"):  # binary values are not text
            meta[key] = value if isinstance(value, str) else value.decode(errors="replace")
    meta = {**details, **meta}
    field = meta.get(FIELD_KEY, "")
    if not violations or violations[0][0] != field:
        violations = [(name, "") for name in _fields(meta.get(FIELDS_KEY, ""))]
    retry = meta.get(RETRY_AFTER_KEY)
    return error_for(
        code,
        message,
        field=field,
        subject=meta.get(SUBJECT_KEY, ""),
        retry_after_s=int(retry) / 1000 if retry and retry.isdigit() else None,
        violations=violations if violations and violations[0][0] == field else (),
    )


def _fields(text: str) -> list[str]:
    """The fields of an `omnirt-error-fields` trailer; none for a value that is not a JSON list of them."""
    try:
        fields = json.loads(text) if text else []
    except ValueError:
        return []
    ok = isinstance(fields, list) and all(isinstance(name, str) for name in fields)
    return fields if ok else []


# Messages of grpc core (not of the controller) that mean the address could not be reached.
_TRANSPORT_FAILURES = (
    "failed to connect",
    "errors resolving",
    "dns resolution failed",
    "connection refused",
    "connection reset",
    "socket closed",
    "connections to all backends failing",
)


def map_rpc_error(exc: grpc.RpcError, address: str) -> OmniRTError:
    """The typed error of a failed call; an unreachable controller names its address."""
    err = from_rpc_error(exc)
    if isinstance(err, Unavailable) and any(s in err.message.lower() for s in _TRANSPORT_FAILURES):
        err = Unavailable(f"cannot reach the controller at {address} ({err.message})")
    return err
