"""Backends: which torch device and dtype a model runs on, and the memory a run takes there.

`cpu` runs float32; `cuda` and `ascend` run float16 unless the model's runtime options say
`dtype`. torch_npu (Ascend) is imported here and only when asked for.

Multi-device placement comes from the model's runtime options: `devices` (device indices or
names of the backend: `[1]`, `["cuda:0", "cuda:1"]`) picks the devices, `device_map` (what
diffusers' `from_pretrained(device_map=...)` takes, e.g. "balanced") spreads the components
over them; several devices without a `device_map` mean "balanced". On CPU only "cpu" is valid.

Peak memory of a run (`PeakMemory`, at the end): the process high-water mark on CPU, the
allocator's peak on accelerators. On Linux, writing "5" to /proc/self/clear_refs resets the
process's VmHWM, so the peak read afterwards belongs to this run (with several slots busy it
covers the overlapping runs too); where that is not possible the lifetime peak (`ru_maxrss`) is
reported instead.
"""

from __future__ import annotations

import contextlib
import importlib
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEVICES = {"cpu": "cpu", "cuda": "cuda", "ascend": "npu"}
DEFAULT_DTYPES = {"cpu": "float32", "cuda": "float16", "ascend": "float16"}
DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
}


# diffusers pipelines take "balanced" (components spread over the devices) as device_map.
DEVICE_MAPS = frozenset({"balanced"})


class BackendError(Exception):
    """The backend asked for cannot run here (no device, missing package, bad dtype)."""


@dataclass(frozen=True)
class Placement:
    """Where a model runs: the backend, the torch device string and the dtype name."""

    backend: str
    device: str
    dtype: str
    # diffusers' `device_map` ("" = the whole pipeline on `device`) and the devices it may use.
    device_map: str = ""
    devices: tuple[str, ...] = ()

    def torch_dtype(self) -> Any:
        """The `torch.dtype` of `dtype`."""
        import torch

        return getattr(torch, self.dtype)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _ascend_available() -> bool:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return False
    import torch

    npu = getattr(torch, "npu", None)
    return bool(npu is not None and npu.is_available())


def detect_backend(requested: str) -> str:
    """Resolve `auto` (cuda, then ascend, then cpu) and check that the backend asked for exists."""
    if requested == "auto":
        if _cuda_available():
            return "cuda"
        return "ascend" if _ascend_available() else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not _cuda_available():
            raise BackendError("backend 'cuda' asked for, but torch sees no CUDA device")
        return "cuda"
    if requested == "ascend":
        try:
            importlib.import_module("torch_npu")
        except ImportError as exc:
            raise BackendError(
                "backend 'ascend' needs torch_npu: pip install 'omnirt[ascend]' (or torch-npu)"
            ) from exc
        if not _ascend_available():
            raise BackendError("backend 'ascend' asked for, but torch_npu sees no NPU device")
        return "ascend"
    raise BackendError(f"unknown backend {requested!r}; known: auto, cpu, cuda, ascend")


def worker_device(backend: str) -> str:
    """The devices of a resolved `backend` this process sees, as torch names them: "cpu",
    "cuda:0", "cuda:0,1", "npu:0" (what Hello tells the controller; `runtime.devices` picks
    among them per model). The backend's bare name when torch sees none."""
    if backend not in DEVICES or backend == "cpu":
        return "cpu"
    import torch

    prefix = DEVICES[backend]
    module = getattr(torch, prefix, None)
    count = int(module.device_count()) if module is not None else 0
    return f"{prefix}:{','.join(str(i) for i in range(count))}" if count else prefix


def placement_for(backend: str, runtime: Mapping[str, Any] | None = None) -> Placement:
    """Device and dtype for a model on a resolved `backend`, honouring `runtime["dtype"]` on accelerators.

    `runtime["dtype"]` is one dtype name, or a table of one per backend (`{"cuda": "bfloat16"}`;
    a backend it leaves out runs its default).

    CPU always runs float32: half precision on CPU is slow or unsupported for many ops, and
    catalog entries written for GPUs commonly ask for float16.
    """
    if backend not in DEVICES:
        raise BackendError(f"unknown backend {backend!r}")
    dtype = DEFAULT_DTYPES[backend]
    runtime_options = runtime or {}
    wanted_value = runtime_options.get("dtype", "")
    if isinstance(wanted_value, Mapping):  # one per backend: {cuda = "bfloat16", ascend = "float16"}
        wanted_value = wanted_value.get(backend, "")
    wanted = str(wanted_value or "").lower()
    if wanted and backend != "cpu":
        if wanted not in DTYPE_ALIASES:
            raise BackendError(f"unknown dtype {wanted!r} in the model's runtime options")
        dtype = DTYPE_ALIASES[wanted]
    devices = _devices(backend, runtime_options.get("devices"))
    device_map = _device_map(backend, runtime_options.get("device_map"), devices)
    device = devices[0] if devices else DEVICES[backend]
    return Placement(backend, device, dtype, device_map, devices if device_map else ())


def _devices(backend: str, value: Any) -> tuple[str, ...]:
    """`runtime.devices` as device strings of `backend` (`[0, "cuda:1"]` -> `("cuda:0", "cuda:1")`)."""
    if value is None or value == [] or value == "":
        return ()
    items: Sequence[Any] = [value] if isinstance(value, str | int | float) else value
    if not isinstance(items, Sequence):
        raise BackendError(f"runtime.devices must be a list of device indices or names, not {value!r}")
    prefix = DEVICES[backend]
    devices = []
    for item in items:
        text = str(int(item)) if isinstance(item, int | float) else str(item).strip().lower()
        if backend == "cpu":
            if text != "cpu":
                raise BackendError(f"runtime.devices {value!r}: on the cpu backend only 'cpu' is valid")
            devices.append("cpu")
            continue
        index = text.removeprefix(prefix + ":") if text.startswith(prefix + ":") else text
        if not index.isdigit():
            raise BackendError(
                f"runtime.devices: {item!r} is not a {backend} device (e.g. 0 or '{prefix}:0')"
            )
        devices.append(f"{prefix}:{int(index)}")
    if len(set(devices)) != len(devices):
        raise BackendError(f"runtime.devices {value!r} lists a device twice")
    return tuple(devices)


def _device_map(backend: str, value: Any, devices: tuple[str, ...]) -> str:
    """`runtime.device_map`, checked; "balanced" when several devices are listed without one."""
    text = str(value or "").strip().lower()
    if backend == "cpu":
        if text not in ("", "cpu"):
            raise BackendError(f"runtime.device_map {value!r}: on the cpu backend only 'cpu' is valid")
        return ""
    if not text:
        return "balanced" if len(devices) > 1 else ""
    if text not in DEVICE_MAPS:
        known = ", ".join(sorted(DEVICE_MAPS))
        raise BackendError(f"runtime.device_map {value!r} is not supported; known: {known}")
    return text


def max_memory(placement: Placement) -> dict[int, int] | None:
    """`from_pretrained(max_memory=...)` limiting a device map to `placement.devices` (free memory each)."""
    if not placement.device_map or not placement.devices:
        return None
    import torch

    module = torch.cuda if placement.backend == "cuda" else getattr(torch, "npu", None)
    if module is None:
        return None
    limits = {}
    for device in placement.devices:
        index = int(device.rsplit(":", 1)[1])
        free, _total = module.mem_get_info(index)
        limits[index] = int(free)
    return limits


def configure_threads(torch_threads: int) -> None:
    """Set torch's intra-op CPU threads (0 keeps torch's default)."""
    if torch_threads > 0:
        import torch

        torch.set_num_threads(torch_threads)


# ---- peak memory of a run ------------------------------------------------------------------------

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
