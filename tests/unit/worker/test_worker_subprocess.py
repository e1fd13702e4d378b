"""The subprocess execution mode run in-process: small scripts in tmp_path as catalog commands."""

from __future__ import annotations

import asyncio
import io
import json
import textwrap
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageSequence
from worker_testing import run_assignment

from omnirt import types as t
from omnirt._internal import convert as _convert
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt.controller.core.catalog import Catalog
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import create_executor
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.subprocess import child_process, launchers
from omnirt.worker.modes.subprocess.executor import SubprocessExecutor


@pytest.fixture
def executor(tmp_path: Path) -> SubprocessExecutor:
    config = WorkerConfig(
        mode="subprocess",
        model_dir=str(tmp_path / "models"),
        worker_id="w-sub",
        script_dirs=[str(tmp_path / "scripts")],
    )
    made = create_executor(config)
    assert isinstance(made, SubprocessExecutor)
    return made


def script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    folder = tmp_path / "scripts"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return path


def assignment(
    runtime: dict[str, Any],
    *,
    job_id: str = "job-1",
    extra: dict[str, Any] | None = None,
    inputs: list[t.MediaInput] | None = None,
    deadline_ms: int = 0,
) -> Assignment:
    # The runtime table travels as a protobuf Struct (numbers become floats): do the same here.
    wire_runtime = _convert.dict_from_struct(_convert.struct_from_dict(runtime))
    spec = t.ModelSpec(
        id="script-model",
        tasks=[t.Task.AUDIO2VIDEO],
        execution_mode="subprocess",
        source="/weights/none",
        runtime=wire_runtime,
    )
    request = t.GenerateRequest(
        model="script-model",
        task=t.Task.AUDIO2VIDEO,
        prompt="a singer",
        width=64,
        height=48,
        fps=12.0,
        num_frames=6,
        seed=11,
        output_format="mp4",
        extra=extra or {},
        inputs=inputs or [],
    )
    return Assignment("as-" + job_id, spec, [AssignmentItem(job_id, request)], deadline_ms=deadline_ms)


def only(outcomes: list[ItemOutcome]) -> ItemOutcome:
    (outcome,) = outcomes
    return outcome


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (PID 1 of a container may never reap one)."""
    return child_process.process_state(pid) not in (None, "Z", "X")


def png_bytes(colour: tuple[int, int, int] = (200, 10, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buf, format="PNG")
    return buf.getvalue()


WRITER = """
    import json, os, sys
    from pathlib import Path
    request = json.loads(Path(os.environ["OMNIRT_REQUEST"]).read_text())
    out = Path(os.environ["OMNIRT_OUTPUT_DIR"])
    print("OMNIRT_STAGE prepare start", flush=True)
    print("hello from the script")
    print("warming up", file=sys.stderr, flush=True)
    print("OMNIRT_STAGE prepare end", flush=True)
    for step in range(1, 4):
        print(f"OMNIRT_PROGRESS {step} 3", flush=True)
    from PIL import Image
    Image.open(request["inputs"]["image"]).resize((16, 12)).save(out / "a-frame.png")
    (out / "b-clip.mp4").write_bytes(b"not really a video")
    (out / "b-clip.json").write_text(json.dumps({"num_frames": 6, "fps": 12, "width": 64, "height": 48}))
    (out / "notes.txt").write_text("ignored")
    facts = {k: os.environ[k] for k in ("OMNIRT_JOB_DIR", "OMNIRT_JOB_ID", "OMNIRT_SEED", "GREETING")}
    facts.update(request=request, cwd=os.getcwd())
    Path(os.environ["FACTS"]).write_text(json.dumps(facts))
"""


def test_protocol_lines_become_events_logs_stream_and_artifacts_are_collected(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    path = script(tmp_path, WRITER)
    facts_file = tmp_path / "facts.json"
    runtime = {"command": str(path), "env": {"GREETING": "hi", "FACTS": str(facts_file)}, "timeout_s": 60}
    image = t.MediaInput(t.MediaRole.IMAGE, data=png_bytes())
    outcome = only(run_assignment(executor, assignment(runtime, inputs=[image], extra={"k": 1}))[0])
    assert outcome.error is None and outcome.result is not None, outcome.error
    frame, clip = outcome.result.artifacts
    assert (frame.kind, frame.mime_type, frame.width, frame.height) == (
        t.MediaKind.IMAGE,
        "image/png",
        16,
        12,
    )
    assert frame.verify() and frame.size_bytes == len(frame.data) and frame.file_name == "job-1-0.png"
    assert (clip.kind, clip.mime_type, clip.num_frames, clip.fps) == (t.MediaKind.VIDEO, "video/mp4", 6, 12.0)
    assert (clip.width, clip.height, clip.duration_ms, clip.seed) == (64, 48, 500, 11)
    report = outcome.result.report
    assert (report.execution_mode, report.model, report.worker_id) == ("subprocess", "script-model", "w-sub")
    assert {"prepare", "run", "export"} <= {timing.name for timing in report.timings}
    assert report.config_resolved["launcher"] == "python"
    assert report.config_resolved["command"] == str(path)
    assert "prompt" not in report.config_resolved

    facts = json.loads(facts_file.read_text())
    job_dir = Path(facts["OMNIRT_JOB_DIR"])
    assert job_dir.parent == tmp_path / "jobs", "job folders live beside the model folder"
    assert not job_dir.exists(), "the job folder is removed after the job"
    assert facts["cwd"] == str(job_dir) and facts["OMNIRT_JOB_ID"] == "job-1" and facts["GREETING"] == "hi"
    request = facts["request"]
    assert (request["prompt"], request["seed"], request["fps"], request["num_frames"]) == (
        "a singer",
        11,
        12.0,
        6,
    )
    assert (request["width"], request["height"], request["extra"]) == (64, 48, {"k": 1})
    assert request["inputs"] == {"image": str(job_dir / "inputs" / "image.png")}


def test_event_order_progress_stages_and_logs(executor: SubprocessExecutor, tmp_path: Path) -> None:
    path = script(tmp_path, WRITER)
    runtime = {"command": str(path), "env": {"GREETING": "x", "FACTS": str(tmp_path / "f.json")}}
    image = t.MediaInput(t.MediaRole.IMAGE, data=png_bytes())
    _, events = run_assignment(executor, assignment(runtime, inputs=[image]))
    kinds = [e.kind for e in events]
    assert kinds[0] is t.EventKind.STATE and events[0].state is t.JobState.RUNNING
    progress = [(e.progress.step, e.progress.total_steps, e.progress.stage) for e in events if e.progress]
    assert progress == [(1, 3, "run"), (2, 3, "run"), (3, 3, "run")]
    stages = [(e.stage, e.stage_finished) for e in events if e.kind is t.EventKind.STAGE]
    assert stages == [
        ("run", False),
        ("prepare", False),
        ("prepare", True),
        ("run", True),
        ("export", False),
        ("export", True),
    ]
    logs = [(e.log_stream, e.log_text) for e in events if e.kind is t.EventKind.LOG]
    assert ("stdout", "hello from the script") in logs and ("stderr", "warming up") in logs
    assert not any("OMNIRT_" in text for _, text in logs), "protocol lines are not logged"


def test_non_zero_exit_is_internal_with_the_tail_of_the_log(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    path = script(
        tmp_path,
        """
        import sys
        for i in range(1, 31):
            print(f"line {i}", flush=True)
        print("Traceback: the model exploded", file=sys.stderr)
        sys.exit(3)
        """,
    )
    outcome = only(run_assignment(executor, assignment({"command": str(path)}))[0])
    assert outcome.error is not None and outcome.error.code == "INTERNAL"
    message = outcome.error.message
    assert "exited with status 3" in message and "the model exploded" in message
    assert "line 30" in message and "line 12" in message and "line 11\n" not in message, "the last 20 lines"


def _spawner(tmp_path: Path) -> Path:
    # The command ignores SIGTERM and starts three grandchildren: one in its group, one that left
    # it, one that detached from the process tree as well.
    return script(
        tmp_path,
        """
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        same = subprocess.Popen(["sleep", "60"])
        away = subprocess.Popen(["sleep", "61"], start_new_session=True)
        detached = subprocess.run(  # double fork: its parent shell is gone before anyone looks
            "sleep 62 >/dev/null 2>&1 & echo $!", shell=True, start_new_session=True,
            capture_output=True, text=True,
        ).stdout.strip()
        with open(sys.argv[1], "w") as f:
            f.write(f"{os.getpid()} {same.pid} {away.pid} {detached}")
        print("ready", flush=True)
        time.sleep(60)
        """,
        name="spawner.py",
    )


def _stop_when_ready(reason: str | None) -> Any:
    def on_event(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.LOG and event.log_text == "ready" and reason:
            flags.request(event.job_id, reason)

    return on_event


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_cancel_kills_the_whole_process_group_and_leaves_no_orphans(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    runtime = {"command": [str(_spawner(tmp_path)), str(pid_file)], "kill_grace_s": 0.3}
    started = time.monotonic()
    outcomes, _ = run_assignment(executor, assignment(runtime), on_event=_stop_when_ready("CANCELLED"))
    assert time.monotonic() - started < 10
    outcome = only(outcomes)
    assert outcome.error is not None and outcome.error.code == "CANCELLED"
    assert "cancelled while running" in outcome.error.message
    pids = _pids(pid_file)
    assert len(pids) == 4
    assert not [pid for pid in pids if alive(pid)], "the command and its grandchildren are gone"


def test_timeout_kills_the_command_and_reports_deadline_exceeded(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    runtime = {"command": [str(_spawner(tmp_path)), str(pid_file)], "timeout_s": 1.0, "kill_grace_s": 0.3}
    started = time.monotonic()
    outcome = only(run_assignment(executor, assignment(runtime))[0])
    assert 1.0 <= time.monotonic() - started < 8
    assert outcome.error is not None and outcome.error.code == "DEADLINE_EXCEEDED"
    assert "runtime.timeout_s (1 s)" in outcome.error.message
    assert not [pid for pid in _pids(pid_file) if alive(pid)]


def test_the_job_deadline_kills_the_command(executor: SubprocessExecutor, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    runtime = {"command": [str(_spawner(tmp_path)), str(pid_file)], "kill_grace_s": 0.3}
    deadline = int(time.time() * 1000) + 1500
    outcome = only(run_assignment(executor, assignment(runtime, deadline_ms=deadline))[0])
    assert outcome.error is not None and outcome.error.code == "DEADLINE_EXCEEDED"
    assert "deadline exceeded while running" in outcome.error.message
    assert not [pid for pid in _pids(pid_file) if alive(pid)]


@pytest.mark.parametrize("key", ["command", "launcher", "env", "timeout_s"])
def test_a_request_cannot_choose_what_runs(executor: SubprocessExecutor, tmp_path: Path, key: str) -> None:
    marker = tmp_path / "ran"
    path = script(tmp_path, f"open({str(marker)!r}, 'w').write('x')")
    outcome = only(run_assignment(executor, assignment({"command": str(path)}, extra={key: "rm -rf /"}))[0])
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", f"extra.{key}")
    assert not marker.exists(), "nothing ran"


def test_commands_resolve_in_script_dirs_and_missing_ones_are_named(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    script(
        tmp_path,
        "from pathlib import Path; import os\n"
        "Path(os.environ['OMNIRT_OUTPUT_DIR'], 'x.wav').write_bytes(b'RIFF')\n",
        name="rel.py",
    )
    found = only(run_assignment(executor, assignment({"command": "rel.py"}))[0])
    assert found.result is not None and found.result.artifacts[0].mime_type == "audio/wav"

    for command in ("missing.py --flag", "/nowhere/at/all.py", "../outside.py"):
        outcome = only(run_assignment(executor, assignment({"command": command}))[0])
        assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION", command
        # Named by its last part: an error shows no worker folder (`.../all.py`).
        assert Path(command.split()[0]).name in outcome.error.message, outcome.error
        assert "runtime.command" in outcome.error.message and "/nowhere" not in outcome.error.message
    module = only(run_assignment(executor, assignment({"command": "-m no_such_module_here"}))[0])
    assert module.error is not None and "module no_such_module_here is not installed" in module.error.message


def test_bad_runtime_tables_are_failed_precondition(executor: SubprocessExecutor, tmp_path: Path) -> None:
    path = str(script(tmp_path, "pass"))
    for runtime, field in [
        ({}, "runtime.command"),
        ({"command": path, "launcher": "mpirun"}, "runtime.launcher"),
        ({"command": path, "timeout_s": -1}, "runtime.timeout_s"),
        ({"command": path, "nproc_per_node": 1.5}, "runtime.nproc_per_node"),
        ({"command": path, "input_formats": {"audio": ["aiff"]}}, "runtime.input_formats"),
    ]:
        outcome = only(run_assignment(executor, assignment(runtime))[0])
        assert outcome.error is not None
        assert (outcome.error.code, outcome.error.field) == ("FAILED_PRECONDITION", field)


def test_accelerate_missing_is_a_clear_failed_precondition(
    executor: SubprocessExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = launchers.importlib.util.find_spec
    monkeypatch.setattr(
        launchers.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real(name, *a),
    )
    runtime = {"command": str(script(tmp_path, "pass")), "launcher": "accelerate"}
    outcome = only(run_assignment(executor, assignment(runtime))[0])
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "accelerate is not installed" in outcome.error.message


def test_launchers_build_the_documented_command_lines(tmp_path: Path) -> None:
    path = script(tmp_path, "pass")
    for launcher, expected in [
        ("python", ["-u", str(path), "--x", "1"]),
        (
            "torchrun",
            ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(path), "--x", "1"],
        ),
        ("accelerate", ["-m", "accelerate.commands.launch", "--num_processes", "2", str(path), "--x", "1"]),
    ]:
        settings = launchers.parse_settings(
            {"command": f"{path} --x 1", "launcher": launcher, "nproc_per_node": 2}
        )
        argv = launchers.resolve_command(settings, [], tmp_path).argv
        assert argv[1:] == expected


def test_torchrun_runs_the_script_as_rank_zero(executor: SubprocessExecutor, tmp_path: Path) -> None:
    path = script(
        tmp_path,
        """
        import os
        from pathlib import Path
        rank, world = os.environ["RANK"], os.environ["WORLD_SIZE"]
        Path(os.environ["OMNIRT_OUTPUT_DIR"], f"rank{rank}-of-{world}.wav").write_bytes(b"RIFF")
        print("OMNIRT_PROGRESS 1 1", flush=True)
        """,
    )
    outcome = only(run_assignment(executor, assignment({"command": str(path), "launcher": "torchrun"}))[0])
    assert outcome.result is not None, outcome.error
    assert outcome.result.report.config_resolved["launcher"] == "torchrun"


def test_inputs_are_checked_against_the_catalog_formats(executor: SubprocessExecutor, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = script(tmp_path, f"open({str(marker)!r}, 'w').write('x')")
    runtime = {"command": str(path), "input_formats": {"image": ["png"], "audio": ["wav"]}}
    inputs = [
        t.MediaInput(t.MediaRole.IMAGE, data=png_bytes()),
        t.MediaInput(t.MediaRole.AUDIO, data=b"ID3\x04\x00 an mp3, not a wav"),
    ]
    outcome = only(run_assignment(executor, assignment(runtime, inputs=inputs))[0])
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[1]")
    assert "audio input must be wav (got mp3)" in outcome.error.message
    assert not marker.exists()


def test_log_events_are_capped_and_exit_zero_without_artifacts_fails(
    executor: SubprocessExecutor, tmp_path: Path
) -> None:
    path = script(tmp_path, "for i in range(50):\n    print(f'chatty {i}')\n")
    outcomes, events = run_assignment(executor, assignment({"command": str(path), "max_log_events": 5}))
    logs = [e.log_text for e in events if e.kind is t.EventKind.LOG]
    assert logs[:5] == [f"chatty {i}" for i in range(5)] and len(logs) == 6 and "rest is dropped" in logs[5]
    outcome = only(outcomes)
    assert outcome.error is not None and outcome.error.code == "INTERNAL"
    assert "wrote no artifact" in outcome.error.message and "chatty 49" in outcome.error.message


def test_keep_job_dir_leaves_the_folder_for_debugging(executor: SubprocessExecutor, tmp_path: Path) -> None:
    path = script(tmp_path, "import os\nprint(os.environ['OMNIRT_JOB_DIR'])\nraise SystemExit(1)\n")
    runtime = {"command": str(path), "keep_job_dir": True, "job_dir": str(tmp_path / "kept")}
    _, events = run_assignment(executor, assignment(runtime))
    (folder,) = [e.log_text for e in events if e.kind is t.EventKind.LOG]
    assert Path(folder).parent == tmp_path / "kept" and (Path(folder) / "request.json").is_file()


def _wav_24bit_stereo(seconds: float, rate: int = 8000) -> bytes:
    n = int(rate * seconds)
    tone = (0.5 * np.sin(2 * np.pi * 220 * np.arange(n) / rate) * (2**23 - 1)).astype("<i4")
    tone[: n // 2] = 0  # silent first half
    stereo = np.repeat(tone, 2)
    raw = b"".join(int(v).to_bytes(3, "little", signed=True) for v in stereo)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(3)
        out.setframerate(rate)
        out.writeframes(raw)
    return buf.getvalue()


def test_the_catalog_demo_renders_a_gif_from_a_24_bit_stereo_wav(executor: SubprocessExecutor) -> None:
    spec = Catalog.load().resolve("talking-head-demo")
    spec.runtime = _convert.dict_from_struct(_convert.struct_from_dict(spec.runtime))
    request = t.GenerateRequest(
        model=spec.id,
        task=t.Task.AUDIO2VIDEO,
        inputs=[
            t.MediaInput(t.MediaRole.IMAGE, data=png_bytes((90, 120, 160))),
            t.MediaInput(t.MediaRole.AUDIO, data=_wav_24bit_stereo(1.0)),
        ],
        width=32,
        height=32,
        fps=8.0,
        seed=3,
        output_format="gif",
    )
    outcomes, events = run_assignment(
        executor, Assignment("as-demo", spec, [AssignmentItem("job-demo", request)])
    )
    outcome = only(outcomes)
    assert outcome.result is not None, outcome.error
    (gif,) = outcome.result.artifacts
    assert (gif.mime_type, gif.num_frames, gif.fps, gif.width, gif.height) == ("image/gif", 8, 8.0, 32, 32)
    with Image.open(io.BytesIO(gif.data)) as image:
        frames = [
            np.asarray(frame.convert("RGB"), dtype=np.float32) for frame in ImageSequence.Iterator(image)
        ]
    assert len(frames) == 8
    means = [float(frame.mean()) for frame in frames]  # GIF colours are dithered: compare brightness
    assert abs(means[0] - means[3]) < 3 and means[6] > means[0] + 10, means
    assert [e.progress.step for e in events if e.progress] == list(range(1, 9))


def test_close_kills_running_commands(executor: SubprocessExecutor, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    runtime = {"command": [str(_spawner(tmp_path)), str(pid_file)], "kill_grace_s": 0.3}

    def on_event(event: t.JobEvent, flags: CancelFlags) -> None:
        if event.kind is t.EventKind.LOG and event.log_text == "ready":
            asyncio.get_running_loop().create_task(executor.close())

    outcome = only(run_assignment(executor, assignment(runtime), on_event=on_event)[0])
    assert outcome.error is not None and "killed by signal 9" in outcome.error.message
    assert not [pid for pid in _pids(pid_file) if alive(pid)]


def test_a_wav_the_command_writes_carries_its_duration_rate_and_channels(tmp_path: Path) -> None:
    import wave

    from omnirt.worker.modes.subprocess.job_dir import collect_artifacts

    with wave.open(str(tmp_path / "speech.wav"), "wb") as writer:
        writer.setnchannels(2)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(b"\0\0\0\0" * 8000)  # half a second of stereo silence
    [clip] = collect_artifacts(tmp_path, "job-9", seed=3)
    assert (clip.kind, clip.mime_type) == (t.MediaKind.AUDIO, "audio/wav")
    assert (clip.duration_ms, clip.sample_rate, clip.channels) == (500, 16000, 2)


def _wav(frames: int = 800) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(b"\1\0" * frames)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("image", "audio", "field", "words"),
    [
        (png_bytes()[:40], _wav(), "inputs[0]", "image input does not decode as png"),
        (png_bytes(), _wav()[:-400], "inputs[1]", "audio input does not decode as wav: it is truncated"),
        (png_bytes(), _wav(0), "inputs[1]", "it holds no samples"),
    ],
)
def test_an_input_that_does_not_decode_is_refused_before_the_command_runs(
    executor: SubprocessExecutor, tmp_path: Path, image: bytes, audio: bytes, field: str, words: str
) -> None:
    marker = tmp_path / "ran"
    path = script(tmp_path, f"open({str(marker)!r}, 'w').write('x')")
    runtime = {"command": str(path), "input_formats": {"image": ["png"], "audio": ["wav"]}}
    inputs = [t.MediaInput(t.MediaRole.IMAGE, data=image), t.MediaInput(t.MediaRole.AUDIO, data=audio)]
    outcome = only(run_assignment(executor, assignment(runtime, inputs=inputs))[0])
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", field)
    assert words in outcome.error.message
    assert not marker.exists()
