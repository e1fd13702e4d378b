"""Client methods against a scripted server: what goes out, what comes back."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sdk_fake_server import PNG, FakeController, failure_events, job, sample_result, success_events

import omnirt
from omnirt import Client, errors
from omnirt.types import EventKind, JobError, JobState, MediaRole, Task


def test_generate_sends_every_keyword_and_returns_the_result(fake: FakeController) -> None:
    with Client(fake.address, metadata=[("authorization", "Bearer k")]) as client:
        result = client.generate(
            model="tiny-sd",
            prompt="a fox",
            width=64,
            height=64,
            num_inference_steps=4,
            guidance_scale=7.5,
            seed=42,
            labels={"team": "a"},
            extra={"clip_skip": 1},
            image=b"img",
            timeout=10,
        )
    sent = fake.requests[0]
    assert (sent.model, sent.prompt, sent.width, sent.num_inference_steps, sent.seed) == (
        "tiny-sd",
        "a fox",
        64,
        4,
        42,
    )
    assert sent.guidance_scale == 7.5 and sent.labels == {"team": "a"} and sent.extra == {"clip_skip": 1}
    assert sent.inputs[0].role is MediaRole.IMAGE and sent.inputs[0].data == b"img"
    assert fake.metadata[0]["authorization"] == "Bearer k"
    assert result.artifacts[0].data == PNG
    assert result.report.timing("denoise") == 150.4


def test_default_address_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, fake: FakeController
) -> None:
    monkeypatch.setenv("OMNIRT_CONTROLLER", fake.address)
    assert Client().address == fake.address
    result = omnirt.generate(model="tiny-sd", prompt="a fox")
    assert result.job_id == "job-1"
    plan = omnirt.validate(model="tiny-sd", prompt="a fox", width=128)
    assert (plan.model, plan.task, plan.config_resolved["width"]) == ("tiny-sd", Task.TEXT2IMAGE, 128)
    monkeypatch.delenv("OMNIRT_CONTROLLER")
    assert Client().address == "127.0.0.1:50051"


def test_big_inline_results_pass_the_message_size_limit(fake: FakeController) -> None:
    fake.result = sample_result(data=b"x" * (20 << 20))  # gRPC's default limit is 4 MiB
    with Client(fake.address) as client:
        assert len(client.generate(model="tiny-sd", prompt="x").artifacts[0].data) == 20 << 20


def test_submit_then_wait_returns_the_result(fake: FakeController) -> None:
    seen: list[EventKind] = []
    with Client(fake.address) as client:
        submitted = client.submit(model="tiny-sd", prompt="a fox", idempotency_key="k1")
        assert (submitted.id, submitted.state, submitted.idempotency_key) == ("job-1", JobState.QUEUED, "k1")
        result = client.wait(submitted.id, timeout=10, on_event=lambda e: seen.append(e.kind))
    assert result.report.worker_id == "w-1"
    assert seen.count(EventKind.PROGRESS) == 4 and EventKind.RESULT in seen


def test_wait_fetches_the_result_when_success_comes_before_it(fake: FakeController) -> None:
    fake.events["j"] = failure_events("j", JobState.SUCCEEDED, None)
    fake.jobs["j"] = job("j", JobState.SUCCEEDED, result=sample_result("j"))
    with Client(fake.address) as client:
        assert client.wait("j").job_id == "j"


@pytest.mark.parametrize(
    ("state", "error", "cls", "message"),
    [
        (
            JobState.FAILED,
            JobError("INTERNAL", "CUDA out of memory"),
            errors.ExecutionFailed,
            "CUDA out of memory",
        ),
        (
            JobState.FAILED,
            JobError("DEADLINE_EXCEEDED", "deadline passed"),
            errors.DeadlineExceeded,
            "deadline passed",
        ),
        (
            JobState.FAILED,
            JobError("INVALID_ARGUMENT", "bad mask", field="inputs"),
            errors.InvalidRequest,
            "bad mask",
        ),
        (JobState.CANCELLED, None, errors.Cancelled, "job j was cancelled"),
    ],
)
def test_wait_raises_the_typed_error_of_the_job(
    fake: FakeController, state: JobState, error: JobError | None, cls: type, message: str
) -> None:
    fake.events["j"] = failure_events("j", state, error)
    fake.jobs["j"] = job("j", state, error=error)
    with Client(fake.address) as client, pytest.raises(cls) as info:
        client.wait("j")
    assert info.value.message == message
    assert info.value.field == (error.field if error else "")


def test_wait_resumes_after_the_last_event_when_the_stream_ends_early(fake: FakeController) -> None:
    events = success_events("j")
    fake.events["j"] = events[:3]
    fake.jobs["j"] = job("j", JobState.RUNNING)

    def finish_later() -> None:
        time.sleep(0.1)
        fake.events["j"] = events

    threading.Thread(target=finish_later).start()
    with Client(fake.address) as client:
        assert client.wait("j", timeout=10).job_id == "j"
    assert fake.watch_calls[0] == ("j", 0)
    assert fake.watch_calls[-1] == ("j", 3)


def test_wait_timeout_is_a_deadline_error(fake: FakeController) -> None:
    fake.events["j"] = success_events("j")[:2]
    fake.jobs["j"] = job("j", JobState.RUNNING)
    fake.hold_watch = threading.Event()
    started = time.monotonic()
    with Client(fake.address) as client, pytest.raises(errors.DeadlineExceeded, match=r"within 0\.3 s"):
        client.wait("j", timeout=0.3)
    assert time.monotonic() - started < 3
    fake.hold_watch.set()


def test_watch_yields_events_until_the_stream_ends(fake: FakeController) -> None:
    fake.events["j"] = success_events("j")
    with Client(fake.address) as client:
        events = list(client.watch("j"))
        later = list(client.watch("j", after_sequence=8))
    assert [e.sequence for e in events] == list(range(1, 11))
    assert events[1].state is JobState.RUNNING and events[1].worker_id == "w-1"
    assert events[4].progress is not None and (events[4].progress.step, events[4].progress.total_steps) == (
        2,
        4,
    )
    assert [e.kind for e in later] == [EventKind.RESULT, EventKind.STATE]


def test_get_and_list_jobs_follow_pages(fake: FakeController) -> None:
    for i in range(5):
        fake.jobs[f"j{i}"] = job(f"j{i}", JobState.SUCCEEDED if i % 2 else JobState.FAILED)
    with Client(fake.address) as client:
        assert client.get_job("j3").state is JobState.SUCCEEDED
        assert [j.id for j in client.list_jobs()] == ["j0", "j1", "j2", "j3", "j4"]
        assert [j.id for j in client.list_jobs(limit=3)] == ["j0", "j1", "j2"]
        assert [j.id for j in client.list_jobs(states=["succeeded"])] == ["j1", "j3"]
        with pytest.raises(errors.JobNotFound):
            client.get_job("nope")
        with pytest.raises(errors.InvalidRequest, match="unknown job state"):
            client.list_jobs(states=["done"])


def test_cancel_says_whether_it_changed_anything(fake: FakeController) -> None:
    with Client(fake.address) as client:
        first = client.cancel("j")
        fake.cancelled = False
        second = client.cancel("j")
    assert (first.cancelled, first.state) == (True, JobState.CANCELLED)
    assert (second.cancelled, second.state) == (False, JobState.SUCCEEDED)
    assert isinstance(first, omnirt.Job)


def test_download_and_save_fetch_artifacts_that_are_not_inline(fake: FakeController, tmp_path: Path) -> None:
    fake.downloads[("j", 0)] = b"0123456789abcdef"  # streamed in 5-byte chunks
    result = sample_result("j", data=b"0123456789abcdef", inline=False)
    with Client(fake.address) as client:
        assert client.download_artifact("j", 0) == b"0123456789abcdef"
        paths = client.save(result, tmp_path / "out")
    assert paths == [tmp_path / "out" / "j-0.png"]
    assert paths[0].read_bytes() == b"0123456789abcdef"


def test_models_and_workers(fake: FakeController) -> None:
    with Client(fake.address) as client:
        assert [m.id for m in client.list_models()] == ["tiny-sd", "tiny-wan"]
        assert [m.id for m in client.list_models(task="text2video")] == ["tiny-wan"]
        spec = client.describe_model("tiny-stable-diffusion")
        assert (spec.id, spec.defaults.num_inference_steps, spec.presets[0].name) == ("tiny-sd", 4, "fast")
        with pytest.raises(errors.ModelNotFound, match="did you mean"):
            client.describe_model("tiny-sdd")
        workers = client.list_workers()
    assert workers[0].id == "w-1" and workers[0].loaded_models == ["tiny-sd"]
    assert (workers[0].jobs_succeeded, workers[0].jobs_failed, workers[0].device) == (5, 1, "cuda:0,1")


def test_raw_stubs_stay_reachable(fake: FakeController) -> None:
    from omnirt.v1 import models_pb2

    with Client(fake.address) as client:
        resp = client.models.ListModels(models_pb2.ListModelsRequest())
    assert len(resp.models) == 2


def test_a_jobs_own_deadline_is_its_error_not_the_waits(fake: FakeController) -> None:
    error = JobError("DEADLINE_EXCEEDED", "deadline passed while queued")
    fake.events["j"] = failure_events("j", JobState.FAILED, error)
    fake.jobs["j"] = job("j", JobState.FAILED, error=error)
    with Client(fake.address) as client, pytest.raises(errors.DeadlineExceeded) as info:
        client.wait("j", timeout=30)
    assert info.value.message == "deadline passed while queued"
