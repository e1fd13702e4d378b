"""`--preload`: on by default where a model takes long to start (persistent_worker), off elsewhere."""

from __future__ import annotations

import asyncio

import pytest

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.executor import create_executor
from omnirt.worker.main import load_config


def test_preload_defaults_to_on_for_persistent_worker_only() -> None:
    assert WorkerConfig(mode="persistent_worker").preload is True
    assert WorkerConfig(mode="modular").preload is False
    assert WorkerConfig().preload is False
    assert WorkerConfig(mode="persistent_worker", preload=False).preload is False


def test_flag_and_environment_override_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_config(["--mode", "persistent_worker", "--no-preload"]).preload is False
    assert load_config(["--mode", "modular", "--preload"]).preload is True
    monkeypatch.setenv("OMNIRT_PRELOAD", "0")
    assert load_config(["--mode", "persistent_worker"]).preload is False


def test_a_mode_without_preload_says_so() -> None:
    executor = create_executor(WorkerConfig(mode="subprocess"))
    with pytest.raises(NotImplementedError, match="subprocess mode does not preload"):
        asyncio.run(executor.preload(t.ModelSpec(id="m")))
