"""The standard error details of a failed gRPC call, as the tests read them."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

DETAIL_TYPES = (error_details_pb2.ErrorInfo, error_details_pb2.BadRequest, error_details_pb2.RetryInfo)


def status_details(exc: grpc.RpcError) -> dict[str, Any]:
    """The google.rpc.Status details of a failed call, by type name; the Status must agree with
    the call's own code and message."""
    status = rpc_status.from_call(exc)  # type: ignore[arg-type]
    assert status is not None, "no grpc-status-details-bin trailer"
    assert status.code == exc.code().value[0] and status.message == exc.details()
    found: dict[str, Any] = {}
    for any_detail in status.details:
        for cls in DETAIL_TYPES:
            if any_detail.Is(cls.DESCRIPTOR):
                detail = cls()
                any_detail.Unpack(detail)
                found[cls.__name__] = detail
    return found
