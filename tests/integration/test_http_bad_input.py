"""Bad HTTP input through a real controller: every row is a 4xx JSON error naming its field.

Each row goes to a route as an attacker would send it (wrong JSON types, huge or negative
numbers, Infinity, deep nesting, broken multipart, odd headers and path ids). The gateway
answers a 4xx with its JSON error body (the native shape, or OpenAI's on the OpenAI routes),
never a 500 and never a stack trace; its last-resort handler is never reached (the log says
so), and a normal request still succeeds afterwards.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.conftest import USER_CATALOG
from tests.daemons import Controller, Worker
from tests.integration.test_http import VIDEO_CATALOG

MAX_BODY = 64 * 1024
JSON = {"content-type": "application/json"}
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x40\x00\x00\x00\x40"
BIG = 10**30


@pytest.fixture(scope="module")
def controller(log_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    catalog = tmp_path_factory.mktemp("catalog") / "user.toml"
    catalog.write_text(USER_CATALOG + VIDEO_CATALOG)
    daemon = Controller(
        log_dir, "--catalog", str(catalog), "--http-max-body-bytes", str(MAX_BODY), http=True
    ).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def http(controller: Controller, worker: Worker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=controller.http, timeout=30) as client:
        yield client


def nested(depth: int) -> bytes:
    return b'{"model": "null", "prompt": "x", "extra": ' + b'{"a": ' * depth + b"1" + b"}" * (depth + 1)


def raw(fields: bytes) -> dict[str, Any]:
    """A JSON body as bytes: what no JSON encoder writes (NaN, Infinity, 5000 digits)."""
    return {"content": b'{"model": "null", "prompt": "x", ' + fields + b"}", "headers": JSON}


def form(*parts: tuple[str, bytes], boundary: str = "xx", cut: int = 0, charset: str = "") -> dict[str, Any]:
    """A multipart body; a part named `image` is a file. `cut` drops that many bytes at the end;
    `charset` is declared for the text parts."""
    ctext = f"\r\nContent-Type: text/plain; charset={charset}".encode() if charset else b""
    body = (
        b"".join(
            f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"'.encode()
            + (b'; filename="in.png"' if name == "image" else ctext)
            + b"\r\n\r\n"
            + value
            + b"\r\n"
            for name, value in parts
        )
        + f"--{boundary}--\r\n".encode()
    )
    ctype = f"multipart/form-data; boundary={boundary}" if boundary else "multipart/form-data"
    return {"content": body[: len(body) - cut], "headers": {"content-type": ctype}}


def row(method: str, path: str, status: int, field: str | None, **request: Any) -> Any:
    """One bad request: its status and the field its error must name (None: there is no field)."""
    return pytest.param(method, path, request, status, field, id=f"{method} {path[:40]} {field}")


GEN, IMG, EDIT, VID = "/v1/generate", "/v1/images/generations", "/v1/images/edits", "/v1/videos"
SPEECH = "/v1/audio/speech"
OK = {"model": "null", "prompt": "x"}
OK_SPEECH = {"model": "null", "voice": "alloy", "input": "x"}
OK_VIDEO = {"model": "null-video", "prompt": "x"}
ROWS = [
    # ---- JSON bodies: malformed, too deep, not finite, out of range ----
    row("POST", GEN, 400, None, content=b"[" * 1000 + b"]" * 1000, headers=JSON),
    row("POST", GEN, 400, None, content=nested(1000), headers=JSON),
    row("POST", GEN, 400, "extra", content=nested(200), headers=JSON),
    row("POST", GEN, 400, "extra.x", **raw(b'"extra": {"x": Infinity}')),
    row("POST", GEN, 400, "extra.l[1]", **raw(b'"extra": {"l": [1, -Infinity]}')),
    row("POST", GEN, 400, "guidance_scale", **raw(b'"guidance_scale": NaN')),
    row("POST", GEN, 400, "extra.x", **raw(b'"extra": {"x": 1e400}')),
    row("POST", GEN, 400, "extra.x", **raw(b'"extra": {"x": 1' + b"0" * 400 + b"}")),
    row("POST", GEN, 400, "seed", **raw(b'"seed": 1' + b"0" * 5000)),
    row("POST", GEN, 400, None, content=b'{"model": "\xff"}', headers=JSON),
    row("POST", GEN, 400, None, content=b"null", headers=JSON),
    row("POST", GEN, 400, None, json=[OK]),
    row("POST", GEN, 415, None, content=b"model=null", headers={"content-type": "text/plain"}),
    # ---- unpaired surrogates: JSON escapes no UTF-8 (nor protobuf) can hold ----
    row("POST", GEN, 400, "\\udfff", **raw(b'"\\udfff": 1')),
    row("POST", GEN, 400, "prompt", content=b'{"model": "null", "prompt": "\\ud800"}', headers=JSON),
    row("POST", GEN, 400, "extra.\\ud800", **raw(b'"extra": {"\\ud800": 1}')),
    row("POST", GEN, 400, "extra.a[0]", **raw(b'"extra": {"a": ["\\udbff"]}')),
    row("POST", "/v1/jobs", 400, "labels.\\ud800", **raw(b'"labels": {"\\ud800": "v"}')),
    # ---- wrong JSON types and values, field by field ----
    row("POST", GEN, 400, "model", json={**OK, "model": ["null"]}),
    row("POST", GEN, 400, "prompt", json={**OK, "prompt": {"text": "x"}}),
    row("POST", GEN, 400, "width", json={**OK, "width": BIG}),
    row("POST", GEN, 400, "width", json={**OK, "width": -8}),
    row("POST", GEN, 400, "height", json={**OK, "height": "tall"}),
    row("POST", GEN, 400, "seed", json={**OK, "seed": BIG}),
    row("POST", GEN, 400, "num_inference_steps", json={**OK, "num_inference_steps": -1}),
    row("POST", GEN, 400, "guidance_scale", json={**OK, "guidance_scale": 1e308}),
    row("POST", GEN, 400, "priority", json={**OK, "priority": BIG}),
    row("POST", GEN, 400, "timeout_ms", json={**OK, "timeout_ms": -5}),
    row("POST", GEN, 400, "extra", json={**OK, "extra": "s"}),
    row("POST", GEN, 400, "labels", json={**OK, "labels": [1]}),
    row("POST", GEN, 400, "output", json={**OK, "output": "png"}),
    row("POST", GEN, 400, "inputs", json={**OK, "inputs": {"role": "image"}}),
    row("POST", GEN, 400, "inputs[0].role", json={**OK, "inputs": [{"role": "colour"}]}),
    row("POST", GEN, 400, "async", json={**OK, "async": [1]}),
    row("POST", "/v1/jobs", 400, "seed", json={**OK, "seed": BIG}),
    row("POST", "/v1/jobs", 400, "output", json={**OK, "output": 3}),
    row("POST", "/v1/jobs", 400, "output.colour", json={**OK, "output": {"colour": 3}}),
    row("POST", "/v1/validate", 400, "guidance_scale", json={**OK, "guidance_scale": 1e39}),
    row("POST", "/v1/validate", 400, "labels", json={**OK, "labels": {"a": 1}}),
    # ---- query parameters ----
    row("GET", "/v1/jobs", 400, "page_size", params={"page_size": "abc"}),
    row("GET", "/v1/jobs", 400, "page_size", params={"page_size": "-1"}),
    row("GET", "/v1/jobs", 400, "page_size", params={"page_size": str(10**20)}),
    row("GET", "/v1/jobs", 400, "page_size", params={"page_size": "\u00b2"}),
    row("GET", "/v1/jobs", 400, "page_token", params={"page_token": "zzz"}),
    row("GET", "/v1/jobs", 400, "states[0]", params={"states": "zzz"}),
    row("GET", "/v1/omnirt/models", 400, "task", params={"task": "painting"}),
    row("GET", "/v1/jobs/job-x/events", 400, "after_sequence", params={"after_sequence": "9" * 40}),
    # ---- headers ----
    row("GET", "/v1/jobs/job-x/events", 400, "Last-Event-ID", headers={"Last-Event-ID": "9" * 400}),
    row("GET", "/v1/jobs/job-x/events", 400, "Last-Event-ID", headers={"Last-Event-ID": b"\xb2"}),
    row("GET", "/v1/jobs/job-x/events", 400, "Last-Event-ID", headers={"Last-Event-ID": "-1"}),
    # ---- path ids: very long, non-ASCII, not numbers ----
    row("GET", "/v1/jobs/" + "a" * 8000, 400, "job_id"),
    row("GET", "/v1/jobs/\u00e9t\u00e9", 404, "job_id"),
    row("DELETE", "/v1/jobs/%ff%fe", 404, "job_id"),
    row("GET", "/v1/jobs/job-x/artifacts/" + "9" * 30, 400, "index"),
    row("GET", "/v1/jobs/job-x/artifacts/\u00b2", 400, "index"),
    row("GET", "/v1/jobs/job-x/artifacts/-1", 400, "index"),
    row("POST", "/v1/workers/\u00e9/drain", 404, "worker_id"),
    row("GET", "/v1/omnirt/models/" + "m" * 8000, 400, "model"),
    row("GET", "/v1/omnirt/models/\u00e9", 404, "model"),
    # ---- OpenAI images: JSON ----
    row("POST", IMG, 400, None, json=[OK]),
    row("POST", IMG, 400, "model", json={**OK, "model": 1}),
    row("POST", IMG, 400, "prompt", json={**OK, "prompt": None}),
    row("POST", IMG, 400, "n", json={**OK, "n": BIG}),
    row("POST", IMG, 400, "n", json={**OK, "n": -1}),
    row("POST", IMG, 400, "seed", json={**OK, "seed": BIG}),
    row("POST", IMG, 400, "num_inference_steps", json={**OK, "num_inference_steps": BIG}),
    row("POST", IMG, 400, "priority", json={**OK, "priority": BIG}),
    row("POST", IMG, 400, "timeout_ms", json={**OK, "timeout_ms": BIG}),
    row("POST", IMG, 400, "guidance_scale", json={**OK, "guidance_scale": "inf"}),
    row("POST", IMG, 400, "guidance_scale", json={**OK, "guidance_scale": 1e308}),
    row("POST", IMG, 400, "strength", json={**OK, "strength": "nan"}),
    row("POST", IMG, 400, "size", json={**OK, "size": "9" * 30 + "x64"}),
    row("POST", IMG, 400, "size", json={**OK, "size": "\u00b2x64"}),
    row("POST", IMG, 400, "output_compression", json={**OK, "output_compression": "abc"}),
    row("POST", IMG, 400, "response_format", json={**OK, "response_format": 1}),
    row("POST", IMG, 400, "extra", json={**OK, "extra": [1]}),
    row("POST", IMG, 400, "extra.x", **raw(b'"extra": {"x": Infinity}')),
    row("POST", IMG, 400, None, content=b"[" * 1000 + b"]" * 1000, headers=JSON),
    row("POST", IMG, 400, "prompt", content=b'{"model": "null", "prompt": "\\ud800"}', headers=JSON),
    row("POST", IMG, 400, "model", content=b'{"model": "\\ud800", "prompt": "x"}', headers=JSON),
    row("POST", IMG, 400, "extra.a", **raw(b'"extra": {"a": "\\ud800"}')),
    # ---- OpenAI images: multipart ----
    row("POST", EDIT, 400, None, **form(("model", b"null"), boundary="")),
    row("POST", EDIT, 400, None, **form(("model", b"null"), ("prompt", b"x"), cut=12)),
    row("POST", EDIT, 400, "prompt", **form(("model", b"null"), ("prompt", b"\xff\xfe"))),
    row("POST", EDIT, 400, "image", **form(("model", b"null"), ("prompt", b"x"))),
    row("POST", EDIT, 400, "image", **form(("model", b"null"), ("prompt", b"x"), ("image", b"GIF8"))),
    row(
        "POST", EDIT, 400, "n", **form(("model", b"null"), ("prompt", b"x"), ("n", b"9" * 40), ("image", PNG))
    ),
    row("POST", EDIT, 400, None, **form(("model", b"null"), ("pr\x00ompt", b"x"))),  # NUL in a part header
    row(
        "POST",
        EDIT,
        400,
        "prompt",
        **form(("model", b"null"), ("prompt", b"+2AA-"), ("image", PNG), charset="utf-7"),
    ),
    row(
        "POST",
        EDIT,
        400,
        "prompt",
        **form(("model", b"null"), ("prompt", b"\\ud800"), ("image", PNG), charset="unicode_escape"),
    ),
    row("POST", EDIT, 415, None, json=OK),
    # ---- OpenAI videos ----
    row("POST", VID, 400, "prompt", **form(("model", b"null-video"), ("prompt", b"\xff\xfe"))),
    row("POST", VID, 400, "seconds", json={**OK_VIDEO, "seconds": "inf"}),
    row("POST", VID, 400, "seconds", json={**OK_VIDEO, "seconds": 1e308}),
    row("POST", VID, 400, "seconds", json={**OK_VIDEO, "seconds": 3e38}),
    row("POST", VID, 400, "seconds", json={**OK_VIDEO, "seconds": -1}),
    row("POST", VID, 400, "fps", json={**OK_VIDEO, "fps": "nan"}),
    row("POST", VID, 400, "num_frames", json={**OK_VIDEO, "num_frames": BIG}),
    row("POST", VID, 400, "model", json={"prompt": "x"}),
    row("GET", VID, 400, "limit", params={"limit": "abc"}),
    row("GET", VID, 400, "limit", params={"limit": "-1"}),
    row("GET", VID, 400, "limit", params={"limit": str(10**20)}),
    row("GET", VID, 400, "order", params={"order": "sideways"}),
    row("GET", VID + "/" + "v" * 8000, 400, "job_id"),
    row("GET", VID + "/\u00e9", 404, "job_id"),
    row("DELETE", VID + "/\u00e9", 404, "job_id"),
    row("GET", VID + "/job-x/content", 400, "variant", params={"variant": "thumbnail"}),
    # ---- OpenAI speech ----
    row("POST", SPEECH, 400, "input", json={"model": "null", "voice": "alloy"}),
    row("POST", SPEECH, 400, "input", json={**OK_SPEECH, "input": "x" * 4097}),
    row("POST", SPEECH, 400, "voice", json={"model": "null", "input": "x"}),
    row("POST", SPEECH, 400, "voice", json={**OK_SPEECH, "voice": ["alloy"]}),
    row("POST", SPEECH, 400, "voice", json={**OK_SPEECH, "voice": "v" * 65}),
    row("POST", SPEECH, 400, "speed", json={**OK_SPEECH, "speed": 0.1}),
    row("POST", SPEECH, 400, "speed", **raw(b'"voice": "a", "input": "x", "speed": NaN')),
    row("POST", SPEECH, 400, "instructions", json={**OK_SPEECH, "instructions": "whisper"}),
    row("POST", SPEECH, 400, "stream_format", json={**OK_SPEECH, "stream_format": "chunks"}),
    row("POST", SPEECH, 400, "extra", json={**OK_SPEECH, "extra": [1]}),
    row("POST", SPEECH, 400, "model", json={"voice": "alloy", "input": "x"}),
]


@pytest.mark.parametrize(("method", "path", "request_", "status", "field"), ROWS)
def test_bad_input_is_a_4xx_json_error_naming_the_field(
    http: httpx.Client, method: str, path: str, request_: dict[str, Any], status: int, field: str | None
) -> None:
    r = http.request(method, path, **request_)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    assert "Traceback" not in r.text and "File " not in r.text
    error = r.json()["error"]
    if path.startswith(("/v1/images", "/v1/videos", "/v1/audio")):  # OpenAI's shape
        assert set(error) == {"message", "type", "param", "code"}, error
        assert error["type"] == "invalid_request_error" and error["param"] == field, error
    else:
        assert error["code"] in ("INVALID_ARGUMENT", "NOT_FOUND"), error
        assert error.get("field") == field, error
    assert error["message"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (IMG, {**OK, "response_format": "r" * 50_000}, "response_format"),
        (GEN, {**OK, "async": "a" * 50_000}, "async"),
        (GEN, {**OK, "async": ["a" * 1000] * 50}, "async"),
    ],
)
def test_a_huge_bad_value_is_quoted_bounded(http: httpx.Client, path: str, body: Any, field: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text[:500]
    error = r.json()["error"]
    assert error.get("param", error.get("field")) == field and len(error["message"]) < 300, error


def test_a_declared_content_length_over_the_limit_is_413_before_the_body(controller: Controller) -> None:
    host, _, port = controller.http.removeprefix("http://").rpartition(":")
    cases = [(GEN, "application/json", ""), (EDIT, "multipart/form-data; boundary=x", "")]
    cases += [(GEN, "application/json", "Expect: 100-continue\r\n")]  # no go-ahead: the 413 at once
    for path, ctype, expect in cases:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ctype}\r\n{expect}"
            head += f"Content-Length: {100 * MAX_BODY}\r\n\r\n"
            started = time.monotonic()
            sock.sendall(head.encode() + b"{")  # a few bytes of the 6.4 MB it declares, then nothing
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)  # times out (5 s) if the server waits for the body
                if not chunk:
                    break
                answer += chunk
        assert time.monotonic() - started < 2, "answered without waiting for the body"
        head_, _, body = answer.partition(b"\r\n\r\n")
        assert head_.split()[1] == b"413", answer
        error = json.loads(body)["error"]
        assert error["code"] == "INVALID_ARGUMENT" or error["type"] == "invalid_request_error", error
        assert "too large" in error["message"]
    # A body within the limit still gets its go-ahead.
    body = json.dumps({"model": "null", "prompt": "x"}).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = f"POST /v1/validate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Expect: 100-continue\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(body)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 OK")


def test_bad_websocket_frames_get_errors_and_the_socket_stays_open(http: httpx.Client) -> None:
    slow = {"model": "null", "prompt": "slow", "num_inference_steps": 200, "extra": {"sleep_ms_per_step": 50}}
    job = http.post("/v1/jobs", json=slow).json()["job"]
    url = str(http.base_url).replace("http", "ws", 1).rstrip("/") + f"/v1/jobs/{job['id']}/stream"

    async def run() -> list[dict[str, Any]]:
        replies: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.send_str("[" * 5000 + "]" * 5000)
            await ws.send_str('{"type": "ping", "n": 1' + "0" * 5000 + "}")
            await ws.send_json({"type": "t" * 100_000})
            await ws.send_json({"type": "ping"})
            async for frame in ws:
                message = json.loads(frame.data)
                if "event" not in message:
                    replies.append(message)
                if len(replies) == 4:
                    await ws.send_json({"type": "cancel"})
                if "cancel" in message:
                    break
        return replies

    replies = asyncio.run(run())
    assert [next(iter(r)) for r in replies] == ["error", "error", "error", "pong", "cancel"], replies
    assert all(r["error"]["code"] == "INVALID_ARGUMENT" for r in replies[:3])
    assert len(replies[2]["error"]["message"]) < 300, "an unknown type is quoted bounded"


def test_the_last_resort_handler_was_never_reached_and_the_gateway_still_serves(
    http: httpx.Client, controller: Controller
) -> None:
    assert controller.alive()
    assert "HTTP handler failed" not in controller.log()
    r = http.post("/v1/generate", json={"model": "null", "prompt": "still here", "seed": 1})
    assert r.status_code == 200 and r.json()["job"]["state"] == "JOB_STATE_SUCCEEDED", r.text
    r = http.post("/v1/images/generations", json={"model": "null", "prompt": "still here"})
    assert r.status_code == 200 and r.json()["data"][0]["b64_json"], r.text
    assert http.get("/healthz").json()["status"] == "SERVING"
