"""`--preload`: on by default where a model takes long to start (persistent_worker), off elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from worker_testing import make_assignment, run_assignment

from omnirt import types as t
from omnirt.worker.config import WorkerConfig
from omnirt.worker.main import load_config
from omnirt.worker.modes.base import create_executor
from omnirt.worker.modes.legacy_call import LegacyCallExecutor


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


def test_legacy_call_preload_makes_the_first_job_warm(model_dir: Path) -> None:
    executor = LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-pre", torch_threads=1))
    assignment = make_assignment()
    assert "tiny-sd" not in executor.loaded_models()
    asyncio.run(executor.preload(assignment.model))
    assert executor.loaded_models() == ["tiny-sd"]
    outcomes, _ = run_assignment(executor, assignment)
    (outcome,) = outcomes
    assert outcome.error is None and outcome.result is not None
    assert outcome.result.report.cold_start is False, "the preloaded model served the first job"
