"""Run one command in its own process group, stream its lines, and kill all of it on demand.

The command starts with `start_new_session=True`, so it and everything it spawns share a
process group that is not the worker's: signals for the worker never reach it, and a stop
(cancel, deadline, timeout, drain) reaches the whole group: SIGTERM, a grace period, then
SIGKILL. Descendants that left the group (torchrun starts its ranks in new sessions) are found
by walking /proc while the command runs, and processes that detached altogether (double fork)
by an environment entry unique to the run; all are signalled too, checked by start time so
that a reused pid is never hit. Whatever is left when the command exits is killed as well, so
no job leaves orphans behind (a process that clears its environment and detaches before the
worker sees it is the one that can escape).

Stdout and stderr are read in chunks and split into lines on the event loop; `on_line` gets
each line (without its newline), and the last `TAIL_LINES` lines are kept for error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

TAIL_LINES = 20
MAX_LINE_CHARS = 8192
POLL_S = 0.05
SCAN_EVERY_S = 0.5
TIMEOUT = "TIMEOUT"  # the stop reason of a command that ran past its timeout_s

LineHandler = Callable[[str, str], None]
"""Called with (stream name "stdout" or "stderr", line) on the event loop."""


class LaunchError(Exception):
    """The command could not be started at all (no such program, not executable)."""


@dataclass
class ProcessOutcome:
    """How a command ended."""

    returncode: int | None
    stop_reason: str | None = None  # why the worker killed it (CANCELLED, ..., TIMEOUT), or None
    tail: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    peak_rss_bytes: int = 0


# ---- /proc helpers (Linux; elsewhere they find nothing and only the group is signalled) -------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    return raw[raw.rfind(")") + 2 :].split()


def process_state(pid: int) -> str | None:
    """The state letter of `pid` ("R", "S", "Z", ...), or None when there is no such process."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else None


def descendants(root: int) -> dict[int, str]:
    """Every live descendant of `root`: pid -> start time (identifies the process across pid reuse)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and len(fields) > 19:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            start = _start_time(child)
            if start is not None and child not in found:
                found[child] = start
                todo.append(child)
    return found


def marked_processes(marker: str) -> dict[int, str]:
    """Live processes whose environment holds `marker` ("NAME=value"): pid -> start time.

    Finds a job's processes even after they detached (double fork, new session), as long as
    they kept the environment they were started with.
    """
    needle = marker.encode() + b"\0"
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if environ.startswith(needle) or b"\0" + needle in environ:
            start = _start_time(int(entry.name))
            if start is not None:
                found[int(entry.name)] = start
    return found


def _vm_hwm_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _signal_all(pgid: int, known: dict[int, str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid, start in known.items():
        if _start_time(pid) == start:  # the same process, not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


# ---- reading output ------------------------------------------------------------------------


class _LineReader:
    """Splits a stream into lines for `on_line`; keeps a shared tail of recent lines."""

    def __init__(self, name: str, on_line: LineHandler, tail: deque[str]) -> None:
        self.name = name
        self.on_line = on_line
        self.tail = tail
        self.pending = b""

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", errors="replace").rstrip("\r")
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + " [line truncated]"
        self.tail.append(text)
        self.on_line(self.name, text)

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.pending += chunk
            *lines, self.pending = self.pending.split(b"\n")
            for raw in lines:
                self._line(raw)
            if len(self.pending) > MAX_LINE_CHARS * 4:  # a line without end: cut it
                self._line(self.pending)
                self.pending = b""
        if self.pending:
            self._line(self.pending)
            self.pending = b""


# ---- the run -------------------------------------------------------------------------------


class ProcessGroup:
    """One command, its process group and its known descendants."""

    def __init__(self, proc: asyncio.subprocess.Process, marker: str = "") -> None:
        self.proc = proc
        self.marker = marker
        self.pgid = proc.pid  # start_new_session: the leader's pid is the group's id
        self.known: dict[int, str] = {}
        self.peak_rss = 0
        self._last_scan = 0.0

    def scan(self, force: bool = False) -> None:
        """Remember descendants and the leader's memory peak (every SCAN_EVERY_S at most)."""
        now = time.monotonic()
        if not force and now - self._last_scan < SCAN_EVERY_S:
            return
        self._last_scan = now
        self.known.update(descendants(self.pgid))
        self.peak_rss = max(self.peak_rss, _vm_hwm_bytes(self.pgid))

    def kill_now(self) -> None:
        """SIGKILL the group and every known or marked descendant (never raises)."""
        if self.marker:
            self.known.update(marked_processes(self.marker))
        _signal_all(self.pgid, self.known, signal.SIGKILL)

    def exited(self) -> bool:
        """True once the leader has exited (its pipes may still be held open by others)."""
        return self.proc.returncode is not None

    async def wait_exit(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the leader to exit; True when it has."""
        # Not `proc.wait()`: asyncio's waits for the pipes to close too, which a grandchild
        # that left the group may hold open for as long as it lives.
        deadline = time.monotonic() + timeout_s
        while not self.exited() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return self.exited()

    async def terminate(self, grace_s: float) -> None:
        """SIGTERM everything, wait up to `grace_s` for the leader, then SIGKILL everything."""
        if not self.exited():
            self.scan(force=True)
        if self.marker:
            self.known.update(marked_processes(self.marker))
        _signal_all(self.pgid, self.known, signal.SIGTERM)
        await self.wait_exit(grace_s)
        self.kill_now()
        await self.wait_exit(30.0)

    def close_pipes(self) -> None:
        """Stop reading: close the transport (asyncio has no public call for it)."""
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.close()


async def run_command(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    on_line: LineHandler,
    should_stop: Callable[[], str | None],
    timeout_s: float,
    kill_grace_s: float,
    on_start: Callable[[ProcessGroup], None] | None = None,
    marker: str = "",
) -> ProcessOutcome:
    """Run `argv` to its end or until `should_stop()` names a reason or `timeout_s` passes.

    `marker` ("NAME=value", an entry of `env` unique to this run) finds the run's processes
    that left its group and tree. Raises LaunchError when it cannot start. If the calling task
    is cancelled, the whole group is killed before the cancellation goes on.
    """
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
    except OSError as exc:
        raise LaunchError(f"cannot start {argv[0]}: {exc}") from exc
    group = ProcessGroup(proc, marker)
    if on_start is not None:
        on_start(group)
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        asyncio.create_task(_LineReader("stdout", on_line, tail).read(proc.stdout)),
        asyncio.create_task(_LineReader("stderr", on_line, tail).read(proc.stderr)),
    ]
    stop_reason: str | None = None
    try:
        while not group.exited():
            stop_reason = should_stop()
            if stop_reason is None and time.monotonic() - started >= timeout_s:
                stop_reason = TIMEOUT
            if stop_reason is not None:
                await group.terminate(kill_grace_s)
                break
            group.scan()
            await asyncio.sleep(POLL_S)
        # Whatever the command left running dies with the job (and stops holding its pipes).
        group.kill_now()
        await _finish_readers(readers)
    except BaseException:
        group.kill_now()
        for task in readers:
            task.cancel()
        raise
    finally:
        group.close_pipes()
    return ProcessOutcome(
        returncode=proc.returncode,
        stop_reason=stop_reason,
        tail=list(tail),
        duration_s=time.monotonic() - started,
        peak_rss_bytes=group.peak_rss,
    )


async def _finish_readers(readers: Iterable[asyncio.Task[None]], timeout_s: float = 2.0) -> None:
    # A process outside the group may still hold a pipe open; never wait for it for long.
    pending = list(readers)
    done, still = await asyncio.wait(pending, timeout=timeout_s)
    for task in still:
        task.cancel()
    for task in done:
        with contextlib.suppress(Exception):
            task.result()
