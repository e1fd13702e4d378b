"""The execution modes, once: the catalog, the worker's `--mode` and its executor registry read them here."""

from __future__ import annotations

import enum


class ExecutionMode(enum.StrEnum):
    """How a worker runs a model (one mode per worker process)."""

    LEGACY_CALL = "legacy_call"  # the whole pipeline in one call
    MODULAR = "modular"  # the pipeline stage by stage
    SUBPROCESS = "subprocess"  # a command per job, in its own folder
    PERSISTENT_WORKER = "persistent_worker"  # a resident torchrun group


EXECUTION_MODES: tuple[str, ...] = tuple(m.value for m in ExecutionMode)
DEFAULT_MODE = ExecutionMode.LEGACY_CALL
