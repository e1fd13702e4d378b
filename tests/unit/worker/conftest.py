"""Shared fixtures: the tiny Stable Diffusion is built once per session into a temp model dir."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_testing import recording_produced_frames

from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.tiny.registry import ensure_builtin


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model dir holding a freshly built `tiny-sd`."""
    root = tmp_path_factory.mktemp("models")
    ensure_builtin("tiny-sd", root)
    return root


@pytest.fixture(scope="session")
def executor(model_dir: Path) -> LegacyCallExecutor:
    """One warm-capable legacy_call executor for the session (its cache outlives a test)."""
    return LegacyCallExecutor(WorkerConfig(model_dir=str(model_dir), worker_id="w-test", torch_threads=1))


@pytest.fixture(scope="session")
def live_executor(model_dir: Path, executor: LegacyCallExecutor) -> LegacyCallExecutor:
    """The same pipelines (one cache), with every event handed to the loop at once
    (`--progress-interval-ms 0`): for tests that act on a step while the call still runs."""
    config = WorkerConfig(
        model_dir=str(model_dir), worker_id="w-live", torch_threads=1, progress_interval_ms=0
    )
    return LegacyCallExecutor(config, cache=executor.cache)


@pytest.fixture(scope="session", autouse=True)
def produced_frames() -> Iterator[None]:
    """Every video encoded in the worker tests' process keeps the frames it was made from, for
    comparisons before the lossy encode (`worker_testing.produced_frames`)."""
    with recording_produced_frames():
        yield
