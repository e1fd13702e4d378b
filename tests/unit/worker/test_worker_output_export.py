"""A pipeline call's outputs encoded at once: per job, in order, one bad output costing its job only."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
from PIL import Image
from worker_testing import make_assignment

from omnirt import types as t
from omnirt.worker.export import outputs as output_export
from omnirt.worker.modes.events import RunRecorder
from omnirt.worker.pipelines.args import plan_item


def test_calls_run_at_the_same_time_and_each_gives_its_result_or_exception() -> None:
    # The first two calls each wait until both have started: one after the other, the first
    # would time out (one export thread is enough for this, as on a 1-CPU machine).
    together = threading.Barrier(2, timeout=10)
    threads: dict[int, str] = {}

    def call(value: int) -> int:
        threads[value] = threading.current_thread().name
        if value == 2:
            raise ValueError("bad output 2")
        together.wait()
        return value * 10

    results = output_export.in_parallel([lambda v=v: call(v) for v in range(3)])
    assert results[:2] == [0, 10]
    assert isinstance(results[2], ValueError) and str(results[2]) == "bad output 2"
    assert threads[0] == threading.current_thread().name  # the first one costs no thread hop
    assert threads[1] != threads[0]


def test_a_single_output_is_encoded_in_the_calling_thread() -> None:
    assert output_export.in_parallel([threading.current_thread]) == [threading.current_thread()]
    assert output_export.in_parallel([]) == []


def _image(value: int) -> Image.Image:
    return Image.fromarray(np.full((16, 16, 3), value, dtype=np.uint8))


def test_a_batch_is_exported_per_job_and_a_failing_output_fails_only_its_job() -> None:
    assignment = make_assignment(job_ids=("job-a", "job-b", "job-c"), seed=5, num_outputs=2)
    plans = [plan_item(item, assignment.model) for item in assignment.items]
    events: list[t.JobEvent] = []
    recorder = RunRecorder(events.append)
    broken = object()  # not an image: its encoding raises
    done = [
        (plans[0], [_image(10), _image(20)]),
        (plans[1], [_image(30), broken]),
        (plans[2], [_image(40), _image(50)]),
    ]

    exported = output_export.export_outputs(done, recorder)

    assert [plan.job_id for plan, _ in exported] == ["job-a", "job-b", "job-c"]
    (_, a), (_, b), (_, c) = exported
    assert isinstance(b, Exception)
    assert isinstance(a, list) and isinstance(c, list)
    assert [(x.index, x.seed, x.file_name) for x in c] == [(0, 205, "job-c-0.png"), (1, 206, "job-c-1.png")]
    pixels = [int(np.asarray(Image.open(io.BytesIO(x.data)))[0, 0, 0]) for x in (*a, *c)]
    assert pixels == [10, 20, 40, 50]  # each output in its own job, in order
    finished = {e.job_id for e in events if e.kind is t.EventKind.STAGE and e.stage_finished}
    assert finished == {"job-a", "job-c"}
    assert [s.name for s in recorder.timings["job-a"]] == ["export"]
    assert "job-b" not in recorder.timings


@pytest.mark.parametrize("count", [0, 1])
def test_nothing_or_one_job(count: int) -> None:
    assignment = make_assignment(job_ids=("job-1",))
    plan = plan_item(assignment.items[0], assignment.model)
    done = [(plan, [_image(7)])][:count]
    exported = output_export.export_outputs(done, RunRecorder(lambda e: None))
    assert len(exported) == count
