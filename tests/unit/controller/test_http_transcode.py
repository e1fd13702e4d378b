"""The JSON <-> proto transcoder and the error mapping of the HTTP edge, without a server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import MultiDict

from omnirt import errors
from omnirt.controller.http.app import HttpGateway, last_event_id
from omnirt.controller.http.errors import HttpError, error_response, native_body, openai_body, status_of
from omnirt.controller.http.openai_params import Params, generate_request, png_size, sniff_image
from omnirt.controller.http.transcode import (
    MAX_JSON_DEPTH,
    ROUTES,
    artifact_links,
    build_request,
    check_json,
    method_of,
    to_json,
)
from omnirt.controller.observability.metrics import EngineMetrics
from omnirt.types import Task


def request_type(rpc: str):  # type: ignore[no-untyped-def]
    return method_of(rpc).input_type


def test_every_route_names_a_real_rpc_and_body_field() -> None:
    for route in ROUTES:
        method = method_of(route.rpc)
        if route.body not in ("", "*"):
            assert route.body in method.input_type.fields_by_name, route
        for name in route.path.replace("}", "{").split("{")[1::2]:
            assert name in method.input_type.fields_by_name, (route, name)


def test_path_query_and_body_fill_the_request() -> None:
    msg = build_request(
        "request",
        request_type("GenerationService.Submit"),
        {},
        {},
        {"model": "tiny-sd", "prompt": "p", "task": "image2image", "numInferenceSteps": 3,
         "inputs": [{"role": "mask", "data": "AAE="}], "extra": {"eta": 0.5}},
    )  # fmt: skip
    r = msg.request  # type: ignore[attr-defined]
    assert (r.model, r.task, r.num_inference_steps) == ("tiny-sd", 2, 3)
    assert r.inputs[0].role == 2 and r.inputs[0].data == b"\x00\x01" and r.extra["eta"] == 0.5
    query = MultiDict([("states", "queued,running"), ("states", "JOB_STATE_FAILED"), ("page_size", "5")])
    listed = build_request("", request_type("GenerationService.ListJobs"), {}, query, None)
    assert list(listed.states) == [1, 2, 4] and listed.page_size == 5  # type: ignore[attr-defined]
    download = build_request(
        "", request_type("GenerationService.DownloadArtifact"), {"job_id": "j", "index": "2"}, {}, None
    )
    assert (download.job_id, download.index) == ("j", 2)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "query", "field"),
    [
        ({"width": "wide"}, {}, "width"),
        ({"colour": "red"}, {}, "colour"),
        ({"task": "painting"}, {}, "task"),
        ({"seed": 1.5}, {}, "seed"),
        ({"output": {"format": 3}}, {}, "output.format"),
        ({}, {"nope": "1"}, "nope"),
    ],
)
def test_a_bad_field_is_a_400_that_names_it(
    body: dict[str, object], query: dict[str, str], field: str
) -> None:
    with pytest.raises(HttpError) as info:
        build_request("*", request_type("GenerationService.Generate"), {}, query, body)
    assert info.value.status == 400 and info.value.field == field
    assert info.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_a_non_numeric_index_in_the_path_is_a_400() -> None:
    with pytest.raises(HttpError) as info:
        build_request(
            "", request_type("GenerationService.DownloadArtifact"), {"job_id": "j", "index": "x"}, {}, None
        )
    assert info.value.field == "index"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (errors.InvalidRequest("x"), 400),
        (errors.ModelNotFound("x"), 404),
        (errors.JobNotFound("x"), 404),
        (errors.AlreadyExists("x"), 409),
        (errors.QueueFull("x", retry_after_s=1.5), 429),
        (errors.Cancelled("x"), 499),
        (errors.ExecutionFailed("x"), 500),
        (errors.Unavailable("x"), 503),
        (errors.DeadlineExceeded("x"), 504),
        (errors.FailedPrecondition("x"), 400),
        (errors.Unauthenticated("x"), 401),
        (HttpError(415, "x"), 415),
    ],
)
def test_status_codes_map_once(error: errors.OmniRTError, status: int) -> None:
    assert status_of(error) == status
    assert error_response(error).status == status


def test_error_bodies_native_and_openai() -> None:
    full = errors.QueueFull("queue is full", retry_after_s=1.5)
    response = error_response(full)
    assert response.headers["Retry-After"] == "2"
    assert native_body(full) == {
        "error": {"code": "RESOURCE_EXHAUSTED", "message": "queue is full", "retry_after_ms": 1500}
    }
    assert openai_body(full)["error"]["type"] == "rate_limit_error"
    missing = openai_body(errors.ModelNotFound("model: nope", field="model"))["error"]
    assert missing == {"message": "model: nope", "type": "invalid_request_error", "param": "model",
                       "code": "model_not_found"}  # fmt: skip
    assert openai_body(errors.ExecutionFailed("boom"))["error"]["type"] == "server_error"


def test_artifact_references_become_urls() -> None:
    data = {"result": {"artifacts": [{"uri": "omnirt://jobs/j1/artifacts/0"}, {"uri": "s3://b/k"}]}}
    out = artifact_links(data, "http://h:1")
    assert [a["uri"] for a in out["result"]["artifacts"]] == ["http://h:1/v1/jobs/j1/artifacts/0", "s3://b/k"]


def test_json_uses_proto_field_names_and_prints_defaults() -> None:
    msg = build_request("", request_type("GenerationService.GetJob"), {"job_id": "j"}, {}, None)
    assert to_json(msg) == {"job_id": "j"}


def test_openai_params_map_to_a_request() -> None:
    params = Params(
        {"model": "m", "prompt": "p", "n": "2", "size": "64x32", "seed": 3, "guidance_scale": "4.5"}
        | {"output_format": "jpg", "output_compression": 80, "quality": "hd"}
    )
    req = generate_request(params, Task.TEXT2IMAGE)
    assert (req.num_outputs, req.width, req.height, req.seed, req.guidance_scale) == (2, 64, 32, 3, 4.5)
    assert (req.output_format, req.quality) == ("jpeg", 80)
    bad_values = [({"n": "two"}, "n"), ({"size": "huge"}, "size"), ({"seed": True}, "seed")]
    bad_values += [({"prompt": ""}, "prompt"), ({"stream": True}, "stream"), ({"n": 0}, "n")]
    for bad, field in bad_values:
        with pytest.raises(HttpError) as info:
            generate_request(Params({"model": "m", "prompt": "p", **bad}), Task.TEXT2IMAGE)
        assert info.value.field == field


def test_image_sniffing() -> None:
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x40\x00\x00\x00\x20"
    assert sniff_image(png) == "image/png" and png_size(png) == (64, 32)
    assert sniff_image(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff_image(b"\xff\xd8\xff\xe0") == "image/jpeg"
    assert sniff_image(b"hello") == "" and png_size(b"hello") is None


def test_openai_numbers_are_bounded_to_their_proto_types() -> None:
    for bad, field in [
        ({"seed": 2**63}, "seed"),
        ({"num_inference_steps": 2**31}, "num_inference_steps"),
        ({"guidance_scale": "inf"}, "guidance_scale"),
        ({"guidance_scale": 1e39}, "guidance_scale"),
        ({"strength": float("nan")}, "strength"),
        ({"size": "\u00b2x64"}, "size"),
        ({"size": f"{2**31}x64"}, "size"),
        ({"size": "9" * 5000 + "x64"}, "size"),
    ]:
        with pytest.raises(HttpError) as info:
            generate_request(Params({"model": "m", "prompt": "p", **bad}), Task.TEXT2IMAGE)
        assert info.value.field == field and len(info.value.message) < 200
    assert generate_request(Params({"model": "m", "prompt": "p", "seed": 2**63 - 1}), Task.TEXT2IMAGE).seed


def test_json_past_the_depth_limit_or_not_finite_names_its_field() -> None:
    check_json({"extra": {"a": [1.5, {"b": "x"}]}})
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(MAX_JSON_DEPTH + 1):
        inner["a"] = inner = {}
    for data, field in [({"extra": deep}, "extra"), ({"extra": {"l": [1, float("inf")]}}, "extra.l[1]")]:
        with pytest.raises(HttpError) as info:
            check_json(data)
        assert info.value.field == field


def test_a_bad_last_event_id_is_a_400_naming_the_header() -> None:
    assert last_event_id("42") == 42 and last_event_id(str(2**64 - 1)) == 2**64 - 1
    for value in ("9" * 400, str(2**64), "-1", "\u00b2", "4 2"):
        with pytest.raises(HttpError) as info:
            last_event_id(value)
        assert info.value.field == "Last-Event-ID" and len(info.value.message) < 120


def test_the_last_resort_answer_is_a_500_json_error_without_internals() -> None:
    metrics = EngineMetrics(SimpleNamespace())  # type: ignore[arg-type]
    gateway = HttpGateway(SimpleNamespace(), metrics, {}, "127.0.0.1:0", 1024)  # type: ignore[arg-type]

    async def boom(request: web.Request) -> web.Response:
        raise RuntimeError("secret detail in /srv/omnirt/config.toml")

    gateway.app.router.add_get("/v1/boom", boom)
    gateway.app.router.add_get("/v1/images/boom", boom)

    async def run() -> list[tuple[int, dict[str, object]]]:
        async with TestClient(TestServer(gateway.app)) as client:
            return [
                (r.status, await r.json())
                for r in [await client.get("/v1/boom"), await client.get("/v1/images/boom")]
            ]

    (native_status, native), (openai_status, openai) = asyncio.run(run())
    assert native_status == openai_status == 500
    assert native == {
        "error": {"code": "INTERNAL", "message": "internal error; the controller's log has the details"}
    }
    assert openai["error"]["type"] == "server_error"  # type: ignore[index]
    assert "secret" not in str(native) + str(openai) and "RuntimeError" not in str(native) + str(openai)
