"""omnirtctl commands end to end against a scripted server: files, stdout, stderr, status."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from sdk_fake_server import PNG, FakeController, failure_events, job, sample_result

from omnirt import errors
from omnirt.cli.main import main
from omnirt.types import JobError, JobState


def run(fake: FakeController, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["--controller", fake.address, *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_generate_writes_files_and_prints_the_report(
    fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = run(
        fake, capsys, "generate", "-m", "tiny-sd", "-p", "a fox", "--seed", "42", "-o", str(tmp_path)
    )
    assert status == 0, err
    path, line = out.splitlines()
    assert path == str(tmp_path / "job-1-0.png")
    assert Path(path).read_bytes() == PNG
    assert line.startswith(
        "tiny-sd text2image 64x64 · 4 steps · seed 42 · worker w-1 · queue 3 ms · load 812 ms"
    )
    assert line.split(" · ")[-1].startswith("total ")
    assert err == ""  # no progress bar when stderr is not a terminal
    assert fake.requests[0].seed == 42


def test_generate_json_is_one_object(
    fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "-o", str(tmp_path), "--json")
    assert status == 0
    data = json.loads(out)
    assert (data["job_id"], data["state"], data["files"]) == (
        "job-1",
        "succeeded",
        [str(tmp_path / "job-1-0.png")],
    )
    assert data["report"]["worker_id"] == "w-1" and data["report"]["task"] == "text2image"
    assert "data" not in data["artifacts"][0] and data["artifacts"][0]["sha256"] == "0" * 64


def test_generate_downloads_artifacts_that_are_not_inline(
    fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from sdk_fake_server import success_events

    fake.events["job-1"] = success_events("job-1", sample_result("job-1", data=b"big video", inline=False))
    fake.downloads[("job-1", 0)] = b"big video"
    status, out, _ = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "-o", str(tmp_path))
    assert status == 0
    assert Path(out.splitlines()[0]).read_bytes() == b"big video"


def test_generate_detach_prints_the_job_id(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "--detach")[1] == "job-1\n"


def test_invalid_request_is_one_line_and_status_1(
    fake: FakeController, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.fail["Submit"] = errors.InvalidRequest("width: must be a multiple of 8 (got 65)", field="width")
    status, out, err = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "--width", "65")
    assert (status, out, err) == (1, "", "error: INVALID_ARGUMENT: width: must be a multiple of 8 (got 65)\n")


def test_a_failed_job_is_its_error_line(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    error = JobError("INTERNAL", "pipeline raised RuntimeError: boom")
    fake.events["job-1"] = failure_events("job-1", JobState.FAILED, error)
    fake.jobs["job-1"] = job("job-1", JobState.FAILED, error=error)
    status, _, err = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "--json")
    assert (status, err) == (1, "error: INTERNAL: pipeline raised RuntimeError: boom\n")


def test_unreachable_controller(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    assert main(["models", "list", "--controller", address]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: UNAVAILABLE: cannot reach the controller at {address} (")
    assert "Traceback" not in err and err.count("\n") == 1


def test_validate(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(fake, capsys, "validate", "-m", "tiny-sd", "-p", "x", "--width", "128")
    assert status == 0
    assert out.splitlines()[:3] == [
        "model           tiny-sd",
        "task            text2image",
        "execution mode  legacy_call",
    ]
    assert "  width: 128" in out.splitlines()
    assert err == "warning: guidance_scale ignored\n"
    status, out, _ = run(fake, capsys, "validate", "-m", "tiny-sd", "-p", "x", "--json")
    assert json.loads(out)["config_resolved"] == {"width": 64, "num_inference_steps": 4}


def test_models(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(fake, capsys, "models", "list")
    lines = out.splitlines()
    assert status == 0 and lines[0].split() == ["ID", "FAMILY", "TASKS", "MODE", "WORKERS", "ALIASES"]
    assert lines[1].split() == ["tiny-sd", "sd", "text2image", "legacy_call", "1", "tiny-stable-diffusion"]
    assert len(lines) == 3
    status, out, _ = run(fake, capsys, "models", "list", "--task", "text2video", "--json")
    assert [m["id"] for m in json.loads(out)] == ["tiny-wan"]
    status, out, _ = run(fake, capsys, "models", "describe", "tiny-sd")
    assert "batching        yes (max 8)" in out and "fast: fewest steps (num_inference_steps=2)" in out
    status, _, err = run(fake, capsys, "models", "describe", "nope")
    assert (status, err) == (1, "error: NOT_FOUND: unknown model 'nope' (did you mean 'tiny-sd'?)\n")


def test_jobs(fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from sdk_fake_server import success_events

    fake.jobs["a"] = job("a", JobState.RUNNING, worker_id="w-1")
    fake.jobs["b"] = job("b", JobState.FAILED, error=JobError("INTERNAL", "boom"))
    fake.events["a"] = success_events("a")

    status, out, _ = run(fake, capsys, "jobs", "list")
    assert [line.split()[:3] for line in out.splitlines()] == [
        ["ID", "STATE", "MODEL"],
        ["a", "running", "tiny-sd"],
        ["b", "failed", "tiny-sd"],
    ]
    status, out, _ = run(fake, capsys, "jobs", "list", "--state", "failed", "--json")
    assert [j["id"] for j in json.loads(out)] == ["b"]

    status, out, _ = run(fake, capsys, "jobs", "get", "b")
    assert ["error", "INTERNAL: boom"] in [line.split(None, 1) for line in out.splitlines()]

    status, out, _ = run(fake, capsys, "jobs", "watch", "a")
    lines = out.splitlines()
    assert len(lines) == 10 and lines[1].endswith("#2  running on w-1") and "step 2/4 (denoise)" in lines[4]
    status, out, _ = run(fake, capsys, "jobs", "watch", "a", "--after", "8", "--json")
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["result", "state"]

    status, out, _ = run(fake, capsys, "jobs", "wait", "a", "-o", str(tmp_path))
    assert status == 0 and (tmp_path / "a-0.png").read_bytes() == PNG

    assert run(fake, capsys, "jobs", "cancel", "a")[1] == "cancelled job a\n"
    fake.cancelled = False
    assert run(fake, capsys, "jobs", "cancel", "a")[1] == "job a already succeeded; nothing to cancel\n"
    assert json.loads(run(fake, capsys, "jobs", "cancel", "a", "--json")[1])["cancelled"] is False

    status, _, err = run(fake, capsys, "jobs", "get", "nope")
    assert (status, err) == (1, "error: NOT_FOUND: no job 'nope'\n")


def test_workers(fake: FakeController, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(fake, capsys, "workers", "list")
    _, row = out.splitlines()
    assert row.split()[:7] == ["w-1", "ready", "legacy_call", "cpu", "cuda:0,1", "1/2", "5/1"]
    assert "tiny-sd*, tiny-wan" in row
    _, out, _ = run(fake, capsys, "workers", "list", "--json")
    assert json.loads(out)[0]["connected_at"] == "2025-01-02T03:04:05+00:00"


def test_generate_with_a_progress_bar(
    fake: FakeController, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("omnirt.cli.generate.show_progress", lambda json_output: True)
    status, out, err = run(fake, capsys, "generate", "-m", "tiny-sd", "-p", "x", "-o", str(tmp_path))
    assert status == 0, err
    assert out.splitlines()[0] == str(tmp_path / "job-1-0.png")
