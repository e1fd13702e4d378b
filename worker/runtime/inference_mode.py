"""Pipeline calls under `torch.inference_mode()`, unless the pipeline takes gradients.

diffusers wraps a pipeline's `__call__` in `torch.no_grad()`: no graph is built, but every op
still updates version counters and view tracking for autograd. `torch.inference_mode()` skips
that bookkeeping (as TorchServe's handlers and ComfyUI's executor do). The kernels are the
same, so the pixels are too; the saving is per op, so it shows most on small models: a tiny-sd
64x64 4-step job's execution in the worker, one CPU thread, 30.2 -> 28.8 ms (docs/worker.md).

A few pipelines take gradients while they sample (diffusers' attend-and-excite, pix2pix-zero
and DiffEdit call `torch.enable_grad()` inside `__call__`). Inside inference mode
`enable_grad()` has no effect and such a pipeline fails or computes something else, so their
calls run as diffusers runs them. That is decided from the pipeline's code: a class whose
module (or a base class's, below `DiffusionPipeline`) calls `enable_grad(`, `.backward(` or
`autograd.grad(`. The runtime option `inference_mode` (true / false, catalog or request)
overrides the guess, for a custom pipeline that takes gradients some other way.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path
from typing import Any

NAME = "inference_mode"
GRADIENT_MARKERS = ("enable_grad(", ".backward(", "autograd.grad(")
# Base classes of every pipeline: their code is not the pipeline's own.
_LIBRARY_BASES = frozenset({"DiffusionPipeline", "ModularPipeline", "ConfigMixin", "object"})
_TAKES_GRADIENTS: dict[type, bool] = {}  # by pipeline class: its code is read once
_LOCK = threading.Lock()


def takes_gradients(cls: type) -> bool:
    """Whether `cls` (a pipeline class) or one of its own base classes computes gradients."""
    known = _TAKES_GRADIENTS.get(cls)
    if known is None:
        with _LOCK:  # the slots' first calls of a class come at once: read its code once
            known = _TAKES_GRADIENTS.get(cls)
            if known is None:
                known = _TAKES_GRADIENTS[cls] = _reads_gradients(cls)
    return known


def _reads_gradients(cls: type) -> bool:
    # The files are read directly, not through `inspect.getsource`: its line cache is shared by
    # the whole process (tracebacks, warnings) and not safe to use from several threads.
    sources = {
        getattr(sys.modules.get(k.__module__), "__file__", None)
        for k in cls.__mro__
        if k.__name__ not in _LIBRARY_BASES
    }
    for path in sorted(p for p in sources if isinstance(p, str) and p.endswith(".py")):
        try:
            source = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError:  # no source at hand: assume none
            continue
        if any(marker in source for marker in GRADIENT_MARKERS):
            return True
    return False


def use_inference_mode(pipeline: Any, setting: bool | None) -> bool:
    """Whether a call of `pipeline` runs in inference mode: `setting` when the option is set,
    else unless the pipeline takes gradients."""
    if setting is not None:
        return setting
    return not takes_gradients(type(pipeline))


def call_context(enabled: bool) -> contextlib.AbstractContextManager[Any]:
    """`torch.inference_mode()` when `enabled`, else nothing (the pipeline's own `no_grad`)."""
    if not enabled:
        return contextlib.nullcontext()
    import torch

    return torch.inference_mode()
