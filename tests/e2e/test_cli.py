"""omnirtctl as a user runs it: a real process against a real controller and worker."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemons import Controller, Worker


def omnirtctl(controller: Controller, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "omnirt.cli.main"]
    env = {**os.environ, "OMNIRT_CONTROLLER": controller.address}
    proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=180, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"omnirtctl {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def test_generate_writes_the_image_and_prints_path_and_report(
    controller: Controller, worker: Worker, tmp_path: Path
) -> None:
    proc = omnirtctl(
        controller,
        "generate",
        "--model",
        "tiny-sd",
        "--prompt",
        "a red fox",
        "--seed",
        "42",
        "--out",
        str(tmp_path),
    )
    files = list(tmp_path.glob("*.png"))
    assert len(files) == 1
    assert str(files[0]) in proc.stdout
    assert "tiny-sd" in proc.stdout and "seed 42" in proc.stdout and "w-main" in proc.stdout
    assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_generate_json_for_scripts(controller: Controller, worker: Worker, tmp_path: Path) -> None:
    proc = omnirtctl(
        controller,
        "--json",
        "generate",
        "--model",
        "tiny-sd",
        "--prompt",
        "json",
        "--seed",
        "7",
        "--steps",
        "2",
        "--out",
        str(tmp_path),
    )
    data = json.loads(proc.stdout)
    assert data["state"] == "succeeded"
    (path,) = data["files"]
    artifact = data["artifacts"][0]
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == artifact["sha256"]
    assert data["report"]["config_resolved"]["num_inference_steps"] == 2
    assert data["report"]["schema_version"] == "1.0.0"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--model", "tiny-sd", "--prompt", "x", "--width", "65"],
            "INVALID_ARGUMENT: width: must be a multiple of 8",
        ),
        (["--model", "nope-sd", "--prompt", "x"], "NOT_FOUND: model 'nope-sd' not found"),
        (["--model", "tiny-sd", "--prompt", ""], "INVALID_ARGUMENT: prompt: required"),
        (["--model", "tiny-sd", "--prompt", "x", "--steps", "0"], "num_inference_steps: must be positive"),
    ],
)
def test_bad_input_is_one_clear_line(controller: Controller, args: list[str], words: str) -> None:
    for command in ("generate", "validate"):
        proc = omnirtctl(controller, command, *args, check=False)
        assert proc.returncode == 1
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_unreachable_controller_is_one_clear_line(tmp_path: Path) -> None:
    exe = shutil.which("omnirtctl", path=str(Path(sys.executable).parent))
    argv = [exe] if exe else [sys.executable, "-m", "omnirt.cli.main"]
    proc = subprocess.run(
        [*argv, "--controller", "127.0.0.1:9", "models", "list"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "UNAVAILABLE" in proc.stderr and "127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_jobs_and_workers(controller: Controller, worker: Worker) -> None:
    assert "tiny-sd" in omnirtctl(controller, "models", "list").stdout
    described = json.loads(omnirtctl(controller, "models", "describe", "tiny-sd", "--json").stdout)
    assert described["id"] == "tiny-sd" and "text2image" in described["tasks"]
    workers = json.loads(omnirtctl(controller, "workers", "list", "--json").stdout)
    assert any(w["id"] == "w-main" for w in workers)
    jobs = json.loads(omnirtctl(controller, "jobs", "list", "--json").stdout)
    assert jobs, "earlier generations are listed"
    job = json.loads(omnirtctl(controller, "jobs", "get", jobs[0]["id"], "--json").stdout)
    assert job["id"] == jobs[0]["id"]
    watched = omnirtctl(controller, "jobs", "watch", jobs[0]["id"]).stdout
    assert "succeeded" in watched.lower() or "cancelled" in watched.lower() or "failed" in watched.lower()


def test_models_list_served_shows_only_what_a_worker_serves(controller: Controller, worker: Worker) -> None:
    listed = {m["id"]: m for m in json.loads(omnirtctl(controller, "models", "list", "--json").stdout)}
    served = json.loads(omnirtctl(controller, "models", "list", "--served", "--json").stdout)
    assert {m["id"] for m in served} == {i for i, m in listed.items() if m["serving_workers"]}
    assert "tiny-sd" in {m["id"] for m in served} and len(served) < len(listed)
    table = omnirtctl(controller, "models", "list", "--served").stdout.strip().splitlines()
    assert len(table) == 1 + len(served)  # the heading, then one line per served model


def test_json_output_has_integers_where_the_numbers_are_whole(controller: Controller) -> None:
    text = omnirtctl(controller, "--json", "validate", "--model", "tiny-sd", "--prompt", "x").stdout
    resolved = json.loads(text)["config_resolved"]
    assert resolved["width"] == 64 and isinstance(resolved["width"], int), text
    assert isinstance(resolved["num_inference_steps"], int)


def test_validate_and_cancel(controller: Controller) -> None:
    resolved = json.loads(
        omnirtctl(
            controller, "validate", "--model", "tiny-sd", "--prompt", "x", "--preset", "fast", "--json"
        ).stdout
    )
    assert resolved["config_resolved"]["num_inference_steps"] == 2
    submitted = omnirtctl(
        controller, "--json", "generate", "--model", "unserved-sd", "--prompt", "x", "--no-wait"
    )
    job_id = json.loads(submitted.stdout)["id"]
    cancelled = json.loads(omnirtctl(controller, "jobs", "cancel", job_id, "--json").stdout)
    assert cancelled["state"] == "cancelled"
