"""A bounded, seeded fuzz of both edges: malformed gRPC and HTTP requests against real daemons.

A real controller (gRPC and `--http`) and a real worker running the `null` model. Hundreds of
requests built from the contract's own descriptors with hostile values (extreme integers,
NaN and infinities, huge and odd strings, deep `extra`), some with their wire bytes corrupted
or cut, go to every public RPC; as many HTTP requests with garbage, mutated and hostile JSON,
odd headers and paths go to every route. What a user would notice must hold: no INTERNAL or
UNKNOWN status, no 5xx, no daemon exit, no accepted job failing INTERNAL on the worker, and a
normal request works afterwards over both edges. The seed is fixed, so a failure reproduces.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import grpc
import httpx
import pytest
from google.protobuf import descriptor, message, struct_pb2

import omnirt
from omnirt.v1 import cluster_pb2, generation_pb2, models_pb2, types_pb2
from tests.daemons import Controller, Worker

SEED = 20261201
GRPC_REQUESTS = 300
HTTP_REQUESTS = 300
CALL_TIMEOUT_S = 20.0
FD = descriptor.FieldDescriptor
# Where a user would see a server fault: a status the server did not choose for the input.
SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS}
INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
ODD_STRINGS = [
    "",
    "null",
    "tiny-sd",
    "file:///etc/shadow",
    "file:///dev/zero",
    "../../../../etc/passwd",
    "\x00\x01\x7f",
    "é" * 300,
    "🦊" * 1000,
    "%s%n{}${x}",
    "a" * 5000,
    "x" * 200_000,
    "-1",
    "9" * 400,
    "<script>",
    "PNG",
]
NUMBERS = [0, -1, 1, 7, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 10**30, 1e308, -1e308, 0.5]


def _int(rng: random.Random, kind: int) -> int:
    low, high = INT_RANGES[kind]
    choice = rng.choice([0, 1, -1, low, high, 2**31, 2**53, rng.randint(low, high)])
    return max(low, min(high, choice))


def _float(rng: random.Random) -> float:
    return rng.choice([0.0, -1.0, 1.0, 1e308, -1e308, math.inf, -math.inf, math.nan, rng.uniform(-1e6, 1e6)])


def _json_value(rng: random.Random, depth: int) -> Any:
    roll = rng.random()
    if depth > 0 and roll < 0.3:
        return [_json_value(rng, depth - 1) for _ in range(rng.randint(0, 3))]
    if depth > 0 and roll < 0.5:
        return {
            rng.choice(["runtime", "clip_skip", "x", "sleep_ms_per_step", "é"]): _json_value(rng, depth - 1)
        }
    return rng.choice([*NUMBERS, *ODD_STRINGS[:10], True, None, math.inf, math.nan])


def _fill_struct(rng: random.Random, struct: struct_pb2.Struct) -> None:
    """Random `extra`: typed keys the worker reads, odd values, and now and then deep nesting."""
    for _ in range(rng.randint(1, 4)):
        key = rng.choice(["clip_skip", "guidance_rescale", "runtime", "sleep_ms_per_step", "x", "y" * 300])
        value = struct.fields[key]
        if rng.random() < 0.15:  # nested in place, past what protobuf decodes
            for _ in range(rng.choice([20, 60, 120])):
                value = value.list_value.values.add()
        value.MergeFrom(_to_value(_json_value(rng, 3)))


def _to_value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    if isinstance(data, bool):
        value.bool_value = data
    elif isinstance(data, int | float):
        value.number_value = float(data)
    elif isinstance(data, str):
        value.string_value = data
    elif isinstance(data, list):
        value.list_value.values.extend(_to_value(x) for x in data)
    elif isinstance(data, dict):
        for k, v in data.items():
            value.struct_value.fields[k].CopyFrom(_to_value(v))
    else:
        value.null_value = struct_pb2.NULL_VALUE
    return value


def _fill(rng: random.Random, msg: message.Message, depth: int = 0) -> None:
    """Set a random subset of `msg`'s fields to hostile values of their types."""
    if msg.DESCRIPTOR.full_name == "google.protobuf.Struct":
        _fill_struct(rng, msg)  # type: ignore[arg-type]
        return
    for field in msg.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            container = getattr(msg, field.name)
            for _ in range(rng.randint(1, 40)):
                key = rng.choice(ODD_STRINGS[:11]) + str(rng.randint(0, 9))
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FD.TYPE_STRING:
                    container[key] = rng.choice(ODD_STRINGS)
            continue
        repeats = rng.randint(1, 3) if field.is_repeated else 1
        for _ in range(repeats):
            _set(rng, msg, field, depth)


def _set(rng: random.Random, msg: message.Message, field: Any, depth: int) -> None:
    repeated = field.is_repeated
    if field.type == FD.TYPE_MESSAGE:
        if depth > 3:
            return
        child = getattr(msg, field.name).add() if repeated else getattr(msg, field.name)
        _fill(rng, child, depth + 1)
        if not repeated and not child.ListFields():
            child.SetInParent()
        return
    if field.type in INT_RANGES:
        value: Any = _int(rng, field.type)
    elif field.type == FD.TYPE_ENUM:
        value = rng.choice([*(v.number for v in field.enum_type.values), 99, -5])
    elif field.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        value = _float(rng)
    elif field.type == FD.TYPE_BOOL:
        value = rng.random() < 0.5
    elif field.type == FD.TYPE_STRING:
        value = rng.choice(ODD_STRINGS)
    else:
        value = rng.randbytes(rng.choice([0, 1, 64, 70_000]))
    if repeated:
        getattr(msg, field.name).append(value)
    else:
        setattr(msg, field.name, value)


def _mangle(rng: random.Random, data: bytes) -> bytes:
    """Now and then garbage, a cut or flipped bytes instead of the message as built."""
    roll = rng.random()
    if roll < 0.1:
        return rng.randbytes(rng.randint(1, 200))
    if roll < 0.2 and data:
        return data[: rng.randrange(len(data))]
    if roll < 0.3 and data:
        flipped = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flipped[rng.randrange(len(flipped))] = rng.randrange(256)
        return bytes(flipped)
    return data


# method path -> (request type, server streaming); DrainWorker gets ids that name no worker.
METHODS: dict[str, tuple[type[message.Message], bool]] = {
    "/omnirt.v1.GenerationService/Generate": (types_pb2.GenerateRequest, False),
    "/omnirt.v1.GenerationService/Submit": (generation_pb2.SubmitRequest, False),
    "/omnirt.v1.GenerationService/GetJob": (generation_pb2.GetJobRequest, False),
    "/omnirt.v1.GenerationService/ListJobs": (generation_pb2.ListJobsRequest, False),
    "/omnirt.v1.GenerationService/CancelJob": (generation_pb2.CancelJobRequest, False),
    "/omnirt.v1.GenerationService/Validate": (generation_pb2.ValidateRequest, False),
    "/omnirt.v1.GenerationService/WatchJob": (generation_pb2.WatchJobRequest, True),
    "/omnirt.v1.GenerationService/DownloadArtifact": (generation_pb2.DownloadArtifactRequest, True),
    "/omnirt.v1.ModelService/ListModels": (models_pb2.ListModelsRequest, False),
    "/omnirt.v1.ModelService/DescribeModel": (models_pb2.DescribeModelRequest, False),
    "/omnirt.v1.ClusterService/ListWorkers": (cluster_pb2.ListWorkersRequest, False),
    "/omnirt.v1.ClusterService/DrainWorker": (cluster_pb2.DrainWorkerRequest, False),
}


def _grpc_request(rng: random.Random, kind: type[message.Message]) -> message.Message:
    msg = kind()
    _fill(rng, msg)
    request = getattr(msg, "request", None)
    if isinstance(request, message.Message) and rng.random() < 0.7:
        request.model = "null"  # most reach validation past the catalog lookup, and some a worker
    if hasattr(msg, "worker_id"):
        msg.worker_id = "no-such-" + msg.worker_id[:50]  # type: ignore[attr-defined]
    return msg


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), http=True).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(log_dir, controller.address, "w-fuzz", model_dir, "--models", "null", "--slots", "4")
    daemon.start()
    controller.wait_worker("w-fuzz", timeout=120)
    yield daemon
    daemon.stop()


def _call(channel: grpc.Channel, path: str, streaming: bool, data: bytes) -> grpc.StatusCode:
    try:
        if streaming:
            for _ in channel.unary_stream(path)(data, timeout=CALL_TIMEOUT_S):
                pass
        else:
            channel.unary_unary(path)(data, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _faults(found: list[str], where: str, detail: str) -> None:
    if len(found) < 20:
        found.append(f"{where}: {detail[:300]}")


def test_malformed_grpc_requests_get_client_errors_and_hurt_nothing(
    controller: Controller, worker: Worker
) -> None:
    rng = random.Random(SEED)
    faults: list[str] = []
    codes: dict[str, int] = {}
    submitted: list[str] = []
    with grpc.insecure_channel(controller.address) as channel:
        for _ in range(GRPC_REQUESTS):
            path = rng.choice(list(METHODS))
            kind, streaming = METHODS[path]
            built = _grpc_request(rng, kind)
            data = _mangle(rng, built.SerializeToString())
            code = _call(channel, path, streaming, data)
            codes[code.name] = codes.get(code.name, 0) + 1
            if code in SERVER_FAULTS:
                _faults(faults, path, f"{code.name} for {data[:200]!r}")
            if code is grpc.StatusCode.OK and path.endswith("/Submit"):
                jobs = channel.unary_unary(
                    "/omnirt.v1.GenerationService/ListJobs",
                    response_deserializer=generation_pb2.ListJobsResponse.FromString,
                )(generation_pb2.ListJobsRequest(page_size=1), timeout=CALL_TIMEOUT_S)
                submitted += [job.id for job in jobs.jobs]
    assert not faults, f"server faults ({codes}):\n" + "\n".join(faults)
    assert controller.alive() and worker.alive()
    # The fuzz reached past decoding: both client errors and accepted calls happened.
    assert codes.get("INVALID_ARGUMENT", 0) > 50 and codes.get("OK", 0) > 10, codes
    with omnirt.Client(controller.address) as client:
        for job_id in submitted:  # accepted jobs end without a server fault on the worker
            deadline = time.monotonic() + 60
            while (job := client.get_job(job_id)).state.value in ("QUEUED", "RUNNING"):
                assert time.monotonic() < deadline, f"job {job_id} still {job.state}"
                time.sleep(0.1)
            if job.error is not None:
                assert job.error.code not in ("INTERNAL", "UNKNOWN"), (job_id, job.error)
        result = client.generate(model="null", prompt="still fine", seed=1)
        assert result.artifacts and result.artifacts[0].data


# (method, path template): {job} and {model} become random ids or odd text.
ROUTES = [
    ("POST", "/v1/generate"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("DELETE", "/v1/jobs/{id}"),
    ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/jobs/{id}/artifacts/{n}"),
    ("POST", "/v1/validate"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{id}"),
    ("GET", "/v1/omnirt/models/{id}"),
    ("GET", "/v1/workers"),
    ("POST", "/v1/workers/{id}/drain"),
    ("POST", "/v1/images/generations"),
    ("POST", "/v1/images/edits"),
    ("POST", "/v1/videos"),
    ("GET", "/v1/videos"),
    ("GET", "/v1/videos/{id}"),
    ("GET", "/v1/videos/{id}/content"),
]
JSON_KEYS = [
    "model",
    "prompt",
    "negative_prompt",
    "width",
    "height",
    "num_inference_steps",
    "guidance_scale",
    "seed",
    "num_outputs",
    "timeout_ms",
    "deadline_ms",
    "priority",
    "extra",
    "labels",
    "inputs",
    "adapters",
    "n",
    "size",
    "response_format",
    "output",
    "request",
    "task",
]


def _json_body(rng: random.Random) -> bytes:
    body: dict[str, Any] = {"model": "null" if rng.random() < 0.7 else rng.choice(ODD_STRINGS), "prompt": "x"}
    for key in rng.sample(JSON_KEYS, rng.randint(1, 6)):
        body[key] = _json_value(rng, 3)
    if rng.random() < 0.2:
        body = {"request": body}
    text = json.dumps(body)  # Python writes NaN / Infinity, which strict JSON lacks
    roll = rng.random()
    if roll < 0.08:
        text = "[" * 1000 + "]" * 1000
    elif roll < 0.16:
        text = text[: rng.randrange(max(1, len(text)))]
    elif roll < 0.22:
        return rng.randbytes(rng.randint(1, 300))
    elif roll < 0.26:
        text = json.dumps(rng.choice([[], "x", 5, None, [body]]))
    return text.encode()


def _multipart(rng: random.Random) -> tuple[bytes, str]:
    boundary = "fuzzboundary"
    parts = []
    for name in rng.sample(["model", "prompt", "image", "mask", "n", "size", "é"], rng.randint(1, 5)):
        value = rng.randbytes(rng.randint(0, 100)) if rng.random() < 0.4 else b"null"
        disposition = f'form-data; name="{name}"' + (
            '; filename="a.png"' if name in ("image", "mask") else ""
        )
        parts.append(f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + value + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    if rng.random() < 0.3:
        body = body[: rng.randrange(max(1, len(body)))]
    content_type = rng.choice(
        [f"multipart/form-data; boundary={boundary}", "multipart/form-data", "multipart/form-data; boundary="]
    )
    return body, content_type


def _path(rng: random.Random, template: str) -> str:
    ids = ["job-0", "x" * 400, "é", "..", "%00", "9" * 50, "-1"]
    return template.replace("{id}", quote(rng.choice(ids), safe="")).replace(
        "{n}", rng.choice(["0", "-1", "abc", "9" * 30])
    )


def test_malformed_http_requests_get_4xx_json_errors_and_hurt_nothing(
    controller: Controller, worker: Worker
) -> None:
    rng = random.Random(SEED + 1)
    base = controller.http
    faults: list[str] = []
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base, timeout=CALL_TIMEOUT_S) as http:
        for _ in range(HTTP_REQUESTS):
            method, template = rng.choice(ROUTES)
            path = _path(rng, template)
            headers = {"last-event-id": rng.choice(["", "1", "9" * 400, "-5", "x"])}
            params = {"limit": rng.choice(["10", "abc", "-1", "9" * 30])} if rng.random() < 0.3 else {}
            content = None
            if method == "POST" and template == "/v1/images/edits":
                content, headers["content-type"] = _multipart(rng)
            elif method == "POST":
                content = _json_body(rng)
                headers["content-type"] = rng.choice(
                    ["application/json", "application/json", "text/plain", ""]
                )
            if method == "GET" and template.endswith("/events"):
                headers["accept"] = "text/event-stream"
            response = http.request(method, path, content=content, headers=headers, params=params)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code >= 500:
                _faults(faults, f"{method} {path[:80]}", f"{response.status_code} {response.text}")
            elif response.status_code >= 400 and "json" not in response.headers.get("content-type", ""):
                _faults(faults, f"{method} {path[:80]}", f"{response.status_code} not JSON: {response.text}")
        assert not faults, f"server faults ({statuses}):\n" + "\n".join(faults)
        assert controller.alive() and worker.alive()
        assert sum(n for s, n in statuses.items() if 400 <= s < 500) > 100, statuses
        ok = http.post("/v1/generate", json={"model": "null", "prompt": "still fine"})
        assert ok.status_code == 200, ok.text
