"""Backends: which torch device and dtype a model runs on.

`cpu` runs float32; `cuda` and `ascend` run float16 unless the model's runtime options say
`dtype`. torch_npu (Ascend) is imported here and only when asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
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


class BackendError(Exception):
    """The backend asked for cannot run here (no device, missing package, bad dtype)."""


@dataclass(frozen=True)
class Placement:
    """Where a model runs: the backend, the torch device string and the dtype name."""

    backend: str
    device: str
    dtype: str

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


def placement_for(backend: str, runtime: Mapping[str, Any] | None = None) -> Placement:
    """Device and dtype for a model on a resolved `backend`, honouring `runtime["dtype"]` on accelerators.

    CPU always runs float32: half precision on CPU is slow or unsupported for many ops, and
    catalog entries written for GPUs commonly ask for float16.
    """
    if backend not in DEVICES:
        raise BackendError(f"unknown backend {backend!r}")
    dtype = DEFAULT_DTYPES[backend]
    wanted = str((runtime or {}).get("dtype", "") or "").lower()
    if wanted and backend != "cpu":
        if wanted not in DTYPE_ALIASES:
            raise BackendError(f"unknown dtype {wanted!r} in the model's runtime options")
        dtype = DTYPE_ALIASES[wanted]
    return Placement(backend=backend, device=DEVICES[backend], dtype=dtype)


def configure_threads(torch_threads: int) -> None:
    """Set torch's intra-op CPU threads (0 keeps torch's default)."""
    if torch_threads > 0:
        import torch

        torch.set_num_threads(torch_threads)
