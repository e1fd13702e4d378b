"""Fixtures: a real controller and worker for the module, a shared tiny-model folder for the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemons import Controller, Worker

# No worker in these tests runs execution mode `modular` for it, so its jobs wait in the queue.
UNSERVED_SD = """
[[models]]
id = "unserved-sd"
tasks = ["text2image"]
execution_mode = "modular"
source = "builtin:tiny-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
"""

# A model no worker serves and one whose weights are missing.
USER_CATALOG = (
    UNSERVED_SD
    + """
[[models]]
id = "broken-sd"
tasks = ["text2image"]
source = "/nonexistent/weights/broken-sd"
pipeline_class = "StableDiffusionPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
"""
)

# A text2video model in a mode no worker of the tests runs: its jobs stay queued until cancelled.
QUEUED_VIDEO = """
[[models]]
id = "queued-video"
family = "null"
tasks = ["text2video"]
execution_mode = "modular"
source = "builtin:null"
pipeline_class = "NullPipeline"
[models.defaults]
width = 64
height = 64
num_inference_steps = 2
fps = 8
"""


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One model folder for the whole run, so tiny-sd is built once."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="module")
def user_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "user.toml"
    path.write_text(USER_CATALOG)
    return path


@pytest.fixture(scope="module")
def store_args() -> tuple[str, ...]:
    """Extra controller flags choosing the job store (a module may override: see test_scheduler)."""
    return ()


@pytest.fixture(scope="module")
def controller(log_dir: Path, user_catalog: Path, store_args: tuple[str, ...]) -> Iterator[Controller]:
    daemon = Controller(log_dir, "--catalog", str(user_catalog), *store_args).start()
    yield daemon
    daemon.stop()


@pytest.fixture(scope="module")
def worker(controller: Controller, log_dir: Path, model_dir: Path) -> Iterator[Worker]:
    daemon = Worker(log_dir, controller.address, "w-main", model_dir, "--slots", "1").start()
    controller.wait_worker("w-main")
    yield daemon
    daemon.stop()


def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Attach the daemons' logs to a failing test's report."""
    if call.excinfo is None:
        return
    for name in ("controller", "worker"):
        daemon = item.funcargs.get(name) if hasattr(item, "funcargs") else None
        if daemon is not None:
            item.add_report_section(call.when, f"{name} log", daemon.log()[-4000:])
