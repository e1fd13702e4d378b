"""ModelService.LoadModel / UnloadModel: an operator warms a model on workers and frees it.

Real controller (memory store; one test on Redis), real workers: `w-sd` runs legacy_call and
serves every model of it (tiny-sd builds offline), `w-null` serves only the null model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

import omnirt
from omnirt import errors
from omnirt.controller.edges.auth import key_digest
from omnirt.types import JobState, ModelOutcome
from tests.daemons import Controller, Worker, job_store, wait_for

# broken-sd: its weights are missing, so a load of it fails on the worker.
CATALOG = """
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


@pytest.fixture(scope="module")
def cluster(log_dir: Path, model_dir: Path) -> Iterator[tuple[Controller, omnirt.Client]]:
    catalog = log_dir / "catalog.toml"
    catalog.write_text(CATALOG)
    controller = Controller(log_dir, "--catalog", str(catalog)).start()
    sd = Worker(log_dir, controller.address, "w-sd", model_dir).start()
    null = Worker(log_dir, controller.address, "w-null", model_dir, "--models", "null").start()
    try:
        controller.wait_workers({"w-sd", "w-null"})
        with controller.client(timeout=120) as client:
            yield controller, client
    finally:
        null.stop()
        sd.stop()
        controller.stop()


def loaded_on(controller: Controller, worker_id: str) -> list[str]:
    return next(list(w.loaded_models) for w in controller.workers() if w.id == worker_id)


def test_load_warms_the_model_where_it_can_run_and_the_next_job_is_warm(
    cluster: tuple[Controller, omnirt.Client],
) -> None:
    controller, client = cluster
    client.unload_model("tiny-sd")
    (outcome,) = client.load_model("tiny-sd")
    assert outcome.worker_id == "w-sd", "w-null does not serve tiny-sd"
    assert outcome.loaded and outcome.error is None and not outcome.unchanged
    assert outcome.load_ms > 0 and outcome.memory_bytes > 0
    # The controller knows at once: no heartbeat interval to wait for.
    assert "tiny-sd" in loaded_on(controller, "w-sd")
    spec = client.describe_model("tiny-sd")
    assert spec.warm_on == {"w-sd": outcome.memory_bytes}
    listed = {m.id: m for m in client.list_models()}
    assert listed["tiny-sd"].warm_on == {"w-sd": outcome.memory_bytes}
    assert listed["unserved-sd"].warm_on == {}
    report = client.generate(model="tiny-sd", prompt="warm", seed=1, timeout=60).report
    assert report.cold_start is False and report.timing("load") is None
    (again,) = client.load_model("tiny-sd", workers=1)
    assert again.loaded and again.unchanged and again.load_ms == 0


def test_unload_frees_the_model_and_the_next_job_loads_it_again(
    cluster: tuple[Controller, omnirt.Client],
) -> None:
    controller, client = cluster
    client.load_model("tiny-sd")
    outcomes = client.unload_model("tiny-sd")
    assert [(o.worker_id, o.loaded, o.error, o.unchanged) for o in outcomes] == [("w-sd", False, None, False)]
    assert "tiny-sd" not in loaded_on(controller, "w-sd")
    assert client.describe_model("tiny-sd").warm_on == {}
    (again,) = client.unload_model("tiny-sd", worker_ids=["w-sd"])
    assert again.unchanged and not again.loaded and again.error is None
    report = client.generate(model="tiny-sd", prompt="cold", seed=2, timeout=120).report
    assert report.cold_start is True, "an unload is no ban: the next job loads the model again"
    wait_for(lambda: "tiny-sd" in loaded_on(controller, "w-sd"), 10, "the heartbeat to list tiny-sd")


def test_unload_while_a_job_runs_waits_for_the_job(cluster: tuple[Controller, omnirt.Client]) -> None:
    controller, client = cluster
    client.load_model("tiny-sd")
    job = client.submit(model="tiny-sd", prompt="a long one", seed=3, num_inference_steps=100)

    def stepping() -> bool:
        progress = client.get_job(job.id).progress
        return progress is not None and progress.step >= 1

    wait_for(stepping, 60, "the job to take its first step")
    outcomes = client.unload_model("tiny-sd")
    finished = client.get_job(job.id)
    assert finished.state is JobState.SUCCEEDED, "the unload answered before the job it waited for ended"
    assert [(o.worker_id, o.loaded, o.error) for o in outcomes] == [("w-sd", False, None)]
    assert "tiny-sd" not in loaded_on(controller, "w-sd")


def test_a_model_no_connected_worker_can_serve_is_refused_and_nothing_changes(
    cluster: tuple[Controller, omnirt.Client],
) -> None:
    controller, client = cluster
    client.load_model("tiny-sd")
    with pytest.raises(errors.FailedPrecondition) as refused:
        client.load_model("unserved-sd")
    assert refused.value.field == "model"
    assert "unserved-sd" in refused.value.message and "modular" in refused.value.message
    assert "w-sd" in refused.value.message and "w-null" in refused.value.message
    with pytest.raises(errors.FailedPrecondition) as named:
        client.load_model("tiny-sd", worker_ids=["w-null"])
    assert named.value.field == "worker_ids" and "w-null" in named.value.message
    assert loaded_on(controller, "w-sd") == ["tiny-sd"], "a refused load changes nothing"
    assert (
        client.generate(model="tiny-sd", prompt="still fine", seed=4, timeout=60).report.cold_start is False
    )


def test_a_load_that_fails_on_the_worker_says_why_in_its_outcome(
    cluster: tuple[Controller, omnirt.Client],
) -> None:
    controller, client = cluster
    (outcome,) = client.load_model("broken-sd")
    assert outcome.worker_id == "w-sd" and not outcome.loaded
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    assert "broken-sd" in outcome.error.message
    assert controller.alive() and "broken-sd" not in loaded_on(controller, "w-sd")


def test_unknown_models_workers_and_bad_counts_are_precise_errors(
    cluster: tuple[Controller, omnirt.Client],
) -> None:
    _, client = cluster
    with pytest.raises(errors.ModelNotFound):
        client.load_model("no-such-model")
    with pytest.raises(errors.ModelNotFound):
        client.unload_model("no-such-model")
    with pytest.raises(errors.InvalidRequest) as empty:
        client.load_model("")
    assert empty.value.field == "model"
    with pytest.raises(errors.WorkerNotFound) as gone:
        client.load_model("tiny-sd", worker_ids=["w-nowhere"])
    assert gone.value.field == "worker_ids" and "w-nowhere" in gone.value.message
    with pytest.raises(errors.InvalidRequest) as count:
        client.load_model("tiny-sd", workers=2)
    assert count.value.field == "workers" and "2 asked" in count.value.message
    with pytest.raises(errors.InvalidRequest) as long_name:
        client.load_model("x" * 100_000)
    assert long_name.value.field == "model" and len(long_name.value.message) < 300


def test_a_worker_lost_before_it_answers_is_named_in_its_outcome(
    cluster: tuple[Controller, omnirt.Client], log_dir: Path, model_dir: Path
) -> None:
    """A worker frozen (it never answers) and then killed while its load is pending: the call
    ends with an outcome that says the worker was lost; the other workers are untouched."""
    controller, client = cluster
    doomed = Worker(log_dir, controller.address, "w-gone", model_dir, "--models", "tiny-sd").start()
    try:
        controller.wait_worker("w-gone")
        doomed.signal(signal.SIGSTOP)
        answers: list[list[ModelOutcome]] = []
        call = threading.Thread(
            target=lambda: answers.append(client.load_model("tiny-sd", worker_ids=["w-gone"], timeout=60))
        )
        call.start()
        time.sleep(0.5)
        doomed.signal(signal.SIGKILL)
        call.join(60)
    finally:
        doomed.stop(timeout=5)
    assert answers, "the call did not end"
    (outcome,) = answers[0]
    assert outcome.worker_id == "w-gone" and not outcome.loaded
    assert outcome.error is not None and outcome.error.code == "UNAVAILABLE", outcome.error
    assert "w-gone" in outcome.error.message and "lost" in outcome.error.message
    assert {w.id for w in controller.workers()} == {"w-sd", "w-null"}


def omnirtctl(controller: Controller, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMNIRT_CONTROLLER": controller.address}
    argv = [sys.executable, "-m", "omnirt.cli.main", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env)


def test_the_cli_loads_and_unloads(cluster: tuple[Controller, omnirt.Client]) -> None:
    controller, client = cluster
    client.unload_model("tiny-sd")
    loaded = omnirtctl(controller, "models", "load", "tiny-sd", "--worker", "w-sd")
    assert loaded.returncode == 0, loaded.stderr
    assert "w-sd" in loaded.stdout and "loaded" in loaded.stdout and "MB" in loaded.stdout
    described = omnirtctl(controller, "models", "describe", "tiny-sd")
    assert "warm on" in described.stdout and "w-sd" in described.stdout
    unloaded = omnirtctl(controller, "--json", "models", "unload", "tiny-sd")
    assert unloaded.returncode == 0, unloaded.stderr
    assert [(o["worker_id"], o["loaded"]) for o in json.loads(unloaded.stdout)] == [("w-sd", False)]
    failed = omnirtctl(controller, "models", "load", "broken-sd")
    assert failed.returncode == 1 and "FAILED_PRECONDITION" in failed.stdout
    refused = omnirtctl(controller, "models", "load", "unserved-sd")
    assert refused.returncode != 0 and "unserved-sd" in refused.stderr


def _keys(path: Path) -> Path:
    lines = []
    for tenant, role in (("alice", "user"), ("ops", "admin")):
        lines += ["[[keys]]", f'tenant = "{tenant}"', f'role = "{role}"']
        lines += [f'sha256 = "{key_digest(tenant + "-key")}"', ""]
    path.write_text("\n".join(lines))
    return path


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_load_needs_an_admin_key_and_works_on_either_store(
    store: str, tmp_path: Path, model_dir: Path
) -> None:
    with job_store(store, tmp_path) as flags:
        keys = _keys(tmp_path / "keys.toml")
        controller = Controller(tmp_path, *flags, "--auth-keys", str(keys)).start()
        worker = Worker(tmp_path, controller.address, "w-auth", model_dir, "--models", "tiny-sd").start()
        try:
            with controller.client(api_key="ops-key", timeout=120) as admin:
                wait_for(lambda: bool(admin.list_workers()), 60, "the worker to connect")
                with controller.client(api_key="alice-key", timeout=30) as user:
                    for call in (lambda: user.load_model("tiny-sd"), lambda: user.unload_model("tiny-sd")):
                        with pytest.raises(errors.PermissionDenied):
                            call()
                    assert user.describe_model("tiny-sd").warm_on == {}, "a refused load changes nothing"
                (outcome,) = admin.load_model("tiny-sd")
                assert outcome.worker_id == "w-auth" and outcome.loaded and outcome.error is None
                assert set(admin.describe_model("tiny-sd").warm_on) == {"w-auth"}
                started = time.monotonic()
                (freed,) = admin.unload_model("tiny-sd")
                assert not freed.loaded and freed.error is None and time.monotonic() - started < 30
        except grpc.RpcError:
            raise AssertionError(controller.log_tail()) from None
        finally:
            worker.stop()
            controller.stop()


def test_persistent_worker_unload_stops_the_group_and_load_starts_it_again(
    cluster: tuple[Controller, omnirt.Client], log_dir: Path, model_dir: Path
) -> None:
    controller, client = cluster
    pw = Worker(log_dir, controller.address, "w-pw", model_dir, "--mode", "persistent_worker",
                "--models", "tiny-sd-cfg2", "--no-preload").start()  # fmt: skip
    try:
        controller.wait_worker("w-pw")
        (loaded,) = client.load_model("tiny-sd-cfg2")
        assert loaded.worker_id == "w-pw" and loaded.loaded and loaded.error is None, loaded
        assert "tiny-sd-cfg2" in loaded_on(controller, "w-pw")
        report = client.generate(model="tiny-sd-cfg2", prompt="warm", seed=1, timeout=120).report
        assert report.cold_start is False, "the load started the group before the job"
        (freed,) = client.unload_model("tiny-sd-cfg2")
        assert not freed.loaded and freed.error is None and not freed.unchanged, freed
        assert "tiny-sd-cfg2" not in loaded_on(controller, "w-pw")
    finally:
        pw.stop()
