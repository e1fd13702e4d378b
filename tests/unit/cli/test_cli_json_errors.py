"""With --json an error is also a JSON object on stdout; the exit status stays the same."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from sdk_fake_server import FakeController

from omnirt import errors
from omnirt.cli.main import main
from omnirt.cli.output import print_error


def run(fake: FakeController, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["--controller", fake.address, *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_invalid_request_under_json(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    fake.fail["Submit"] = errors.InvalidRequest("width: must be a multiple of 8 (got 65)", field="width")
    status, out, err = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "--width", "65", "--json")
    assert status == 1
    assert json.loads(out) == {
        "error": {
            "code": "INVALID_ARGUMENT",
            "message": "width: must be a multiple of 8 (got 65)",
            "field": "width",
            "subject": "",
            "retry_after_s": None,
            "violations": [{"field": "width", "description": "width: must be a multiple of 8 (got 65)"}],
        }
    }
    assert out.count("\n") == 1  # one line: it can end a JSON Lines stream too
    assert err == "error: INVALID_ARGUMENT: width: must be a multiple of 8 (got 65)\n"


def test_not_found_and_queue_full_under_json(
    fake: FakeController, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.fail["Submit"] = errors.QueueFull("queue is full", retry_after_s=1.5)
    status, out, _ = run(fake, capsys, "--json", "generate", "-m", "tiny-sd", "-p", "x")
    assert status == 1
    assert json.loads(out)["error"] == {
        "code": "RESOURCE_EXHAUSTED",
        "message": "queue is full",
        "field": "",
        "subject": "",
        "retry_after_s": 1.5,
        "violations": [],
    }
    status, out, _ = run(fake, capsys, "jobs", "get", "job-nope", "--json")
    assert status == 1
    assert json.loads(out)["error"]["code"] == "NOT_FOUND"
    assert json.loads(out)["error"]["subject"] == "job"


def test_unreachable_controller_under_json(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    assert main(["models", "list", "--controller", address, "--json"]) == 1
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]
    assert error["code"] == "UNAVAILABLE"
    assert error["message"].startswith(f"cannot reach the controller at {address} (")
    assert err.startswith("error: UNAVAILABLE: ")


def test_a_local_file_error_under_json(
    fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    out_dir = tmp_path / "a-file" / "outputs"  # cannot be made: its parent is a file
    status, out, err = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "-o", str(out_dir), "--json")
    assert status == 1
    error = json.loads(out.splitlines()[-1])["error"]
    assert error["code"] == "OS_ERROR" and str(out_dir) in error["message"]
    assert err == f"error: Not a directory: {out_dir}\n"


def test_without_json_stdout_stays_empty(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    fake.fail["Submit"] = errors.InvalidRequest("prompt: required", field="prompt")
    assert run(fake, capsys, "generate", "-m", "tiny-sd")[:2] == (1, "")


def test_usage_errors_under_json_are_json_too(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "--json", "-m", "tiny-sd", "--width", "abc"])
    out, err = capsys.readouterr()
    assert status == 2
    error = json.loads(out)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and "--width: invalid int value: 'abc'" in error["message"]
    assert "usage: omnirtctl generate" in err
    # Without --json, stdout stays empty.
    assert main(["generate", "-m", "tiny-sd", "--width", "abc"]) == 2
    assert capsys.readouterr().out == ""


def test_every_violated_field_is_in_the_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = errors.InvalidRequest(
        "width: must be positive; num_inference_steps: must be positive",
        field="width",
        violations=[("width", "must be positive"), ("num_inference_steps", "must be positive")],
    )
    print_error(err, json_output=True)
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["field"] == "width"
    assert error["violations"] == [
        {"field": "width", "description": "must be positive"},
        {"field": "num_inference_steps", "description": "must be positive"},
    ]
