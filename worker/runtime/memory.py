"""Peak memory of a run: process high-water mark on CPU, allocator peak on accelerators.

On Linux, writing "5" to /proc/self/clear_refs resets the process's VmHWM, so the peak read
afterwards belongs to this run (with several slots busy it covers the overlapping runs too).
Where that is not possible the lifetime peak (`ru_maxrss`) is reported instead.
"""

from __future__ import annotations

import contextlib
import resource
import sys
from pathlib import Path
from typing import Any

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(key: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def current_rss_bytes() -> int:
    """Resident memory of this process now (0 when unknown)."""
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


def _maxrss_bytes() -> int:
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(maxrss) if sys.platform == "darwin" else int(maxrss) * 1024


class PeakMemory:
    """Measures one run's peak memory on `device` ("cpu", "cuda", "npu")."""

    def __init__(self, device: str) -> None:
        self.device = device

    def _accelerator(self) -> Any:
        import torch

        return getattr(torch, self.device.split(":")[0], None)

    def reset(self) -> None:
        """Start a new measurement."""
        if self.device == "cpu":
            with contextlib.suppress(OSError):
                _CLEAR_REFS.write_text("5")
            return
        module = self._accelerator()
        if module is not None:
            module.reset_peak_memory_stats()

    def peak_bytes(self) -> int:
        """The peak since `reset()`."""
        if self.device == "cpu":
            kib = _status_kib("VmHWM")
            return kib * 1024 if kib is not None else _maxrss_bytes()
        module = self._accelerator()
        return int(module.max_memory_allocated()) if module is not None else 0
