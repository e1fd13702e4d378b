"""Subprocess-mode settings: a catalog entry's `runtime` table -> the argv the worker runs.

The command always comes from the catalog (the ModelSpec of the Assignment): a request has no
field that names one, and its `extra` may not set any of the settings below. Relative script
paths are looked up in the worker's `--script-dirs` and then in the `examples/` folder shipped
with OmniRT (a path that climbs out of its folder with `..` is refused).

Launchers: `python` (this worker's interpreter), `torchrun` (`python -m torch.distributed.run
--standalone --nproc-per-node N`) and `accelerate` (`python -m accelerate.commands.launch
--num_processes N`, when the `accelerate` package is installed).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnirt.worker.failures import JobFailure

FAILED_PRECONDITION = "FAILED_PRECONDITION"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
LAUNCHERS = ("python", "torchrun", "accelerate")
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_KILL_GRACE_S = 3.0
DEFAULT_MAX_LOG_EVENTS = 1000
MEDIA_FORMATS = ("png", "jpeg", "webp", "gif", "wav", "mp3", "flac", "ogg", "mp4")

# The keys of `runtime` this mode reads; request extras may not use any of them.
RUNTIME_KEYS = (
    "command",
    "launcher",
    "launcher_args",
    "nproc_per_node",
    "env",
    "cwd",
    "timeout_s",
    "kill_grace_s",
    "job_dir",
    "keep_job_dir",
    "input_formats",
    "max_log_events",
)


def examples_dir() -> Path:
    """The `examples/` folder next to the OmniRT sources (present in a source checkout)."""
    return Path(__file__).resolve().parents[3] / "examples"


@dataclass(frozen=True)
class SubprocessSettings:
    """The subprocess-mode part of a catalog entry's `runtime` table, checked."""

    command: list[str]
    launcher: str = "python"
    launcher_args: list[str] = field(default_factory=list)
    nproc_per_node: int = 1
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    job_dir: str = ""
    keep_job_dir: bool = False
    # role -> accepted formats (sniffed from the bytes), e.g. {"audio": ["wav"]}
    input_formats: dict[str, list[str]] = field(default_factory=dict)
    max_log_events: int = DEFAULT_MAX_LOG_EVENTS


@dataclass(frozen=True)
class ResolvedCommand:
    """What runs: the full argv, its working directory and a display form for the report."""

    argv: list[str]
    cwd: str
    target: str  # the script path or `-m module`


def _bad_runtime(key: str, reason: str) -> JobFailure:
    return JobFailure(FAILED_PRECONDITION, f"catalog runtime.{key}: {reason}", f"runtime.{key}")


def _integer(runtime: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    # Runtime tables travel as a protobuf Struct, where every number is a float.
    value = runtime.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != int(value)
        or value < minimum
    ):
        raise _bad_runtime(key, f"must be an integer of at least {minimum} (got {value!r})")
    return int(value)


def _positive_number(runtime: Mapping[str, Any], key: str, default: float) -> float:
    value = runtime.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _bad_runtime(key, f"must be a positive number of seconds (got {value!r})")
    return float(value)


def parse_settings(runtime: Mapping[str, Any]) -> SubprocessSettings:
    """Check a `runtime` table; FAILED_PRECONDITION (the catalog is wrong, not the request)."""
    raw = runtime.get("command")
    if isinstance(raw, str):
        try:
            command = shlex.split(raw)
        except ValueError as exc:
            raise _bad_runtime("command", f"cannot be split into arguments: {exc}") from None
    elif isinstance(raw, list) and all(isinstance(x, str) for x in raw):
        command = list(raw)
    else:
        raise _bad_runtime("command", "required: a string or a list of strings (script or -m module, args)")
    if not command or (command[0] == "-m" and len(command) < 2):
        raise _bad_runtime("command", "names no script or module")
    launcher = runtime.get("launcher", "python")
    if launcher not in LAUNCHERS:
        raise _bad_runtime("launcher", f"{launcher!r} is not one of {', '.join(LAUNCHERS)}")
    launcher_args = runtime.get("launcher_args", [])
    if not isinstance(launcher_args, list) or not all(isinstance(x, str) for x in launcher_args):
        raise _bad_runtime("launcher_args", "must be a list of strings")
    env = runtime.get("env", {})
    if not isinstance(env, Mapping):
        raise _bad_runtime("env", "must be a table of NAME = value")
    formats = runtime.get("input_formats", {})
    if not isinstance(formats, Mapping):
        raise _bad_runtime("input_formats", "must be a table of role = [formats]")
    input_formats: dict[str, list[str]] = {}
    for role, names in formats.items():
        listed = [names] if isinstance(names, str) else names
        if not isinstance(listed, list) or not all(n in MEDIA_FORMATS for n in listed):
            raise _bad_runtime("input_formats", f"{role}: formats must be among {', '.join(MEDIA_FORMATS)}")
        input_formats[str(role)] = list(listed)
    return SubprocessSettings(
        command=command,
        launcher=str(launcher),
        launcher_args=list(launcher_args),
        nproc_per_node=_integer(runtime, "nproc_per_node", 1, 1),
        env={str(k): str(v) for k, v in env.items()},
        cwd=str(runtime.get("cwd", "")),
        timeout_s=_positive_number(runtime, "timeout_s", DEFAULT_TIMEOUT_S),
        kill_grace_s=_positive_number(runtime, "kill_grace_s", DEFAULT_KILL_GRACE_S),
        job_dir=str(runtime.get("job_dir", "")),
        keep_job_dir=bool(runtime.get("keep_job_dir", False)),
        input_formats=input_formats,
        max_log_events=_integer(runtime, "max_log_events", DEFAULT_MAX_LOG_EVENTS, 0),
    )


def check_extras(extra: Mapping[str, Any]) -> None:
    """A request may not steer what runs: INVALID_ARGUMENT for `extra.command` and the like."""
    for key in extra:
        if key in RUNTIME_KEYS:
            raise JobFailure(
                INVALID_ARGUMENT,
                f"extra.{key}: cannot be set by a request; the command and how it runs come from the catalog",
                f"extra.{key}",
            )


def find_script(name: str, search_dirs: list[Path]) -> Path:
    """An absolute script path as is, a relative one in the first of `search_dirs` holding it."""
    path = Path(name).expanduser()
    if path.is_absolute():
        if not path.is_file():
            raise _bad_runtime("command", f"script {name} does not exist")
        return path
    for root in search_dirs:
        candidate = (root / path).resolve()
        if not candidate.is_relative_to(root.resolve()):
            raise _bad_runtime("command", f"script {name} climbs out of {root}")
        if candidate.is_file():
            return candidate
    where = ", ".join(str(d) for d in search_dirs) or "no folder (set --script-dirs)"
    raise _bad_runtime("command", f"script {name} does not exist (looked in {where})")


def _check_module(module: str, settings: SubprocessSettings) -> None:
    # Only the top-level package is looked up (finding `a.b` would import `a`); a module found
    # through the command's own PYTHONPATH or cwd cannot be checked from here.
    if "PYTHONPATH" in settings.env or settings.cwd:
        return
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise _bad_runtime("command", f"module {module} is not installed for {sys.executable}")


def _launcher_prefix(settings: SubprocessSettings) -> list[str]:
    if settings.launcher == "python":
        return [sys.executable, "-u", *settings.launcher_args]
    if settings.launcher == "torchrun":
        if importlib.util.find_spec("torch") is None:
            raise _bad_runtime("launcher", "torchrun needs torch, which is not installed on this worker")
        # --standalone: a local rendezvous on a free port, so concurrent jobs never collide.
        nproc = str(settings.nproc_per_node)
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", nproc]
    if importlib.util.find_spec("accelerate") is None:
        raise _bad_runtime("launcher", "accelerate is not installed on this worker (pip install accelerate)")
    nproc = str(settings.nproc_per_node)
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", nproc]


def resolve_command(settings: SubprocessSettings, search_dirs: list[Path], job_dir: Path) -> ResolvedCommand:
    """The argv to run for `settings`; FAILED_PRECONDITION naming a script or module not there."""
    prefix = _launcher_prefix(settings)
    if settings.launcher != "python":
        prefix += settings.launcher_args
    head, *args = settings.command
    if head == "-m":
        module, *args = args
        _check_module(module, settings)
        target, script_dir, entry = f"-m {module}", None, ["-m", module]
    else:
        script = find_script(head, search_dirs)
        target, script_dir, entry = str(script), script.parent, [str(script)]
    cwd = job_dir
    if settings.cwd:
        cwd = Path(settings.cwd).expanduser()
        if not cwd.is_absolute():
            cwd = (script_dir or job_dir) / cwd
        if not cwd.is_dir():
            raise _bad_runtime("cwd", f"folder {cwd} does not exist")
    return ResolvedCommand(argv=[*prefix, *entry, *args], cwd=str(cwd), target=target)
