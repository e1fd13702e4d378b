"""One refusal for every field at fault: how validation gathers them, how they travel, how the
SDK reads them back (the round trip through a real controller: tests/integration/test_error_details.py)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from omnirt import errors
from omnirt.controller.core.bounds import Violations, bad
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.validation import validate
from omnirt.controller.edges.interceptors import status_trailers
from omnirt.types import GenerateRequest, Task


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def refusal(catalog: Catalog, **fields: Any) -> errors.InvalidRequest:
    with pytest.raises(errors.InvalidRequest) as info:
        validate(GenerateRequest(**{"model": "tiny-sd", "prompt": "x", **fields}), catalog)
    return info.value


def test_independent_faults_are_all_named_the_first_as_before(catalog: Catalog) -> None:
    err = refusal(
        catalog, width=0, height=65, num_inference_steps=-2, guidance_scale=-1.0, quality=101, priority=-1
    )
    assert err.field == "priority"  # what validation raised alone before
    assert err.fields == [
        "priority",
        "width",
        "height",
        "num_inference_steps",
        "guidance_scale",
        "output.quality",
    ]
    assert err.message.startswith("priority: must be between 0 and 100 (got -1); width: must be positive")


def test_a_field_is_named_once_and_dependent_checks_wait(catalog: Catalog) -> None:
    # num_frames off the grid and over the limit: one violation, the first rule's.
    assert refusal(catalog, model="tiny-wan", num_frames=10_000).fields == ["num_frames"]
    # A task the model does not do: the prompt and inputs it would need are not judged by it.
    assert refusal(catalog, task=Task.TEXT2VIDEO, prompt="", priority=-1).fields == ["task"]
    # Sizes first: an over-long prompt stops validation before anything quotes other values.
    assert refusal(catalog, prompt="x" * 100_000, width=0).fields == ["prompt"]
    # An unknown preset: the defaults it would set are not judged either.
    assert refusal(catalog, preset="nope", width=0, priority=-1).fields == ["priority", "preset"]


def test_another_error_after_a_fault_does_not_hide_the_fault(catalog: Catalog) -> None:
    with pytest.raises(errors.ModelNotFound):
        validate(GenerateRequest(model="no-such-model", prompt="x", width=0), catalog)
    err = refusal(catalog, priority=-1, model="tiny-sd", extra={"runtime": {"nope": 1}}, width=0)
    assert err.fields[0] == "priority" and "width" in err.fields


def test_the_joined_message_is_bounded_and_every_violation_kept() -> None:
    found = Violations(bad(f"f{i}", "x" * 250) for i in range(20))
    err = found.error()
    assert err is not None and len(err.message) <= 1024 and err.message.endswith("...")
    assert err.fields == [f"f{i}" for i in range(20)]


def _details(trailers: tuple[tuple[str, str | bytes], ...]) -> error_details_pb2.BadRequest:
    data = dict(trailers)["grpc-status-details-bin"]
    assert isinstance(data, bytes)
    bad_request = error_details_pb2.BadRequest()
    for detail in status_pb2.Status.FromString(data).details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            detail.Unpack(bad_request)
    return bad_request


def test_many_huge_violations_stay_inside_the_metadata_limits() -> None:
    found = Violations(bad(f"{i}" + "f" * 600, "\U0001f98a" * 300) for i in range(40))
    err = found.error()
    assert err is not None
    trailers = status_trailers(err, err.message[:1024])
    for key, value in trailers:
        assert len(value) <= (4096 if key.endswith("-bin") else 512), key
    violations = _details(trailers).field_violations
    assert 1 < len(violations) < 40 and violations[0].field == err.field
    assert errors.FIELDS_KEY not in dict(trailers)  # two 512-character paths do not fit one value
    many = Violations(bad(f"extra.key_{i:04d}", "bad") for i in range(100)).error()
    assert many is not None
    trailers = status_trailers(many, many.message)
    fields = json.loads(dict(trailers)[errors.FIELDS_KEY])  # the first ones, as many as fit
    assert 10 < len(fields) < 100 and fields == many.fields[: len(fields)]
    assert len(dict(trailers)[errors.FIELDS_KEY]) <= 512


class _Failed(grpc.RpcError):
    """A failed call as the SDK sees it: code, message, trailers."""

    def __init__(self, trailers: tuple[tuple[str, str | bytes], ...]) -> None:
        self.trailers = trailers

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "a: bad; b: bad"

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.trailers


def test_the_sdk_reads_the_violations_from_the_details_or_else_the_fields_trailer() -> None:
    err = Violations([bad("a", "bad"), bad("b", "bad")]).error()
    assert err is not None
    trailers = status_trailers(err, err.message)
    read = errors.from_rpc_error(_Failed(trailers))
    assert read.violations == [("a", "a: bad"), ("b", "b: bad")]
    # A client without googleapis-common-protos reads only OmniRT's own trailers.
    own = tuple((k, v) for k, v in trailers if not k.endswith("-bin"))
    read = errors.from_rpc_error(_Failed(own))
    assert (read.field, read.fields, read.violations[1]) == ("a", ["a", "b"], ("b", ""))
    # A broken list is no list: the first field still stands.
    broken = errors.from_rpc_error(_Failed(((errors.FIELD_KEY, "a"), (errors.FIELDS_KEY, "[oops"))))
    assert broken.fields == ["a"]
