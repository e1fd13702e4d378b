"""Errors that say everything at once, through a real controller (gRPC and HTTP) and worker.

* A request that breaks several rules is refused naming every field (before: the first only):
  the SDK's error keeps the first in `field` and all in `fields`/`violations`, gRPC clients get
  one `google.rpc.BadRequest` violation per field, the HTTP body a `violations` list.
* A request aiohttp cannot parse (an over-long request line or header, an invalid method, no
  Host) is answered with the gateway's JSON error body, not aiohttp's plain text, and logged as
  one WARNING line per kind a minute, not an ERROR with a traceback each (a fuzz run wrote 200).
* A pipeline argument in `extra` of the wrong type (`timesteps=false`) fails its job
  INVALID_ARGUMENT naming `extra.timesteps`, not INTERNAL from inside diffusers.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

import omnirt
from omnirt import errors
from omnirt.v1 import generation_pb2, generation_pb2_grpc, types_pb2
from tests.daemons import Controller, Worker
from tests.rpc_status import status_details

TWO_FAULTS = {"model": "null", "prompt": "x", "width": 0, "num_inference_steps": -2}


@pytest.fixture(scope="module")
def controller(log_dir: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def client(controller: Controller) -> Iterator[omnirt.Client]:
    with controller.client() as sdk:
        yield sdk


def test_the_sdk_error_names_every_field_at_fault(client: omnirt.Client) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(model="null", prompt="x", width=0, num_inference_steps=-2)
    err = info.value
    assert err.field == "width"  # the first, as before
    assert err.fields == ["width", "num_inference_steps"]
    assert [description for _, description in err.violations] == [
        "width: must be positive (got 0)",
        "num_inference_steps: must be positive (got -2)",
    ]
    assert err.message == "; ".join(description for _, description in err.violations)
    # One fault stays one: `fields` holds it alone.
    with pytest.raises(errors.InvalidRequest) as one:
        client.validate(model="null", prompt="x", width=0)
    assert (one.value.field, one.value.fields) == ("width", ["width"])


def test_grpc_clients_get_one_violation_per_field(controller: Controller) -> None:
    request = types_pb2.GenerateRequest(
        model="null", prompt="x", width=0, num_inference_steps=-2, priority=-1
    )
    with grpc.insecure_channel(controller.address) as channel:
        stub = generation_pb2_grpc.GenerationServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Validate(generation_pb2.ValidateRequest(request=request), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = status_details(info.value)["BadRequest"].field_violations
    assert [v.field for v in violations] == ["priority", "width", "num_inference_steps"]
    assert violations[1].description == "width: must be positive (got 0)"
    trailers = dict(info.value.trailing_metadata() or ())
    assert trailers[errors.FIELD_KEY] == "priority"
    assert json.loads(trailers[errors.FIELDS_KEY]) == ["priority", "width", "num_inference_steps"]


def test_the_http_body_lists_every_violation(controller: Controller) -> None:
    answer = httpx.post(f"{controller.http}/v1/validate", json=TWO_FAULTS, timeout=10)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["field"]) == ("INVALID_ARGUMENT", "width")
    assert [v["field"] for v in error["violations"]] == ["width", "num_inference_steps"]
    assert "width: must be positive" in error["message"] and "num_inference_steps" in error["message"]
    single = httpx.post(f"{controller.http}/v1/validate", json={**TWO_FAULTS, "num_inference_steps": 2})
    assert single.json()["error"]["field"] == "width" and "violations" not in single.json()["error"]


MALFORMED = {
    "request line": b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "header": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 10_000 + b"\r\n\r\n",
    "method": b"G(T /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "host": b"GET /healthz HTTP/1.1\r\n\r\n",
}
REPEATS = 20


def _exchange(address: str, data: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = address.split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


def test_malformed_requests_get_the_json_error_and_one_warning_line_per_kind(
    controller: Controller,
) -> None:
    for name, data in MALFORMED.items():
        for _ in range(REPEATS):
            status, headers, body = _exchange(controller.http, data)
            assert status == 400, (name, body[:200])
            assert headers["content-type"].startswith("application/json"), (name, headers)
            assert headers["x-content-type-options"] == "nosniff"  # the security headers too
            error = json.loads(body)["error"]
            assert error["code"] == "INVALID_ARGUMENT", name
            assert error["message"].startswith("malformed HTTP request: ") and len(error["message"]) < 300
            assert error.get("field") == ("Host" if name == "host" else None), (name, error)
    assert httpx.get(f"{controller.http}/healthz", timeout=10).status_code == 200  # still serving
    log = controller.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    warned = re.findall(
        r"WARNING omnirt\.controller\.http: HTTP 400 to [^:]+: malformed HTTP request: (.*)", log
    )
    # The over-long line and the over-long header are one kind (aiohttp's LineTooLong): one line.
    assert len(warned) == 3, warned
    assert any("Missing 'Host' header" in line for line in warned), warned


@pytest.fixture(scope="module")
def sd_worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(log_dir, controller.address, "w-extra", model_dir, "--models", "tiny-sd").start()
    controller.wait_worker("w-extra", timeout=120)  # a worker imports torch: slow on a busy machine
    yield daemon
    daemon.stop()


def test_an_extra_of_the_wrong_type_fails_invalid_argument_naming_it(
    client: omnirt.Client, sd_worker: Worker
) -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        client.generate(model="tiny-sd", prompt="a fox", num_inference_steps=2, extra={"timesteps": False})
    assert info.value.field == "extra.timesteps", info.value
    assert "expected list[int] | None (got False)" in info.value.message
    result = client.generate(model="tiny-sd", prompt="a fox", num_inference_steps=2, extra={"eta": 0.5})
    assert result.report is not None and result.report.config_resolved["eta"] == 0.5
