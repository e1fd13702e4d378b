"""The mode registry (`omnirt.worker.modes.base`): one executor per `ExecutionMode`, made by name."""

from __future__ import annotations

import pytest

from omnirt._internal.modes import EXECUTION_MODES, ExecutionMode
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import create_executor, executor_modes


def test_every_execution_mode_has_an_executor_of_that_mode() -> None:
    assert executor_modes() == sorted(EXECUTION_MODES)
    for mode in ExecutionMode:
        executor = create_executor(WorkerConfig(mode=mode.value))
        assert executor.mode is mode, f"{type(executor).__name__} says {executor.mode!r}"


def test_an_unknown_mode_is_refused_naming_the_known_ones() -> None:
    config = WorkerConfig()
    # WorkerConfig refuses the name itself; this is the registry's own check behind it.
    object.__setattr__(config, "mode", "warp_drive")
    with pytest.raises(ValueError, match="unknown execution mode 'warp_drive'; known: legacy_call, modular"):
        create_executor(config)
