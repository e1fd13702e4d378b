"""Process helpers of the benchmarks: the daemons come from `omnirt.testing`, plus /proc readings."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from omnirt.testing import Controller, Daemon, Worker, free_port, wait_for

__all__ = [
    "Controller",
    "Daemon",
    "Worker",
    "free_port",
    "null_worker",
    "proc_cpu_s",
    "proc_status_kib",
    "run_benchmark",
    "wait_for",
]


def proc_status_kib(pid: int, key: str) -> int:
    """A `kB` field of /proc/PID/status (VmRSS, VmHWM), in KiB; 0 when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return 0


def proc_cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds the process has used (/proc/PID/stat), or one of its threads
    (/proc/PID/task/TID/stat; the main thread's id is the process id)."""
    path = f"/proc/{pid}/task/{thread}/stat" if thread is not None else f"/proc/{pid}/stat"
    try:
        fields = Path(path).read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def null_worker(log_dir: Path, controller: str, worker_id: str, *extra: str) -> Worker:
    """`omnirt-worker` on the CPU for the null model (its model dir inside `log_dir`)."""
    return Worker(log_dir, controller, worker_id, log_dir / "models", "--backend", "cpu", *extra)


def run_benchmark(
    run: Callable[[Path], Coroutine[Any, Any, dict[str, Any]]],
    print_report: Callable[[dict[str, Any]], None],
    json_path: Path | None,
    errors: tuple[type[BaseException], ...],
    log_chars: int = 3000,
) -> int:
    """Run one benchmark in a scratch log folder; on `errors` print the daemons' log tails and return 1."""
    with tempfile.TemporaryDirectory(prefix="omnirt-bench-") as tmp:
        log_dir = Path(tmp)
        try:
            report = asyncio.run(run(log_dir))
        except errors as exc:
            print(f"benchmark failed: {exc!r}", file=sys.stderr)
            for log in sorted(log_dir.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-log_chars:]}", file=sys.stderr)
            return 1
    print_report(report)
    if json_path:
        json_path.write_text(json.dumps(report, indent=2) + "\n")
    return 0
