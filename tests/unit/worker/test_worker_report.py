"""The one RunReport builder every execution mode uses (`omnirt.worker.modes.events.run_report`)."""

from __future__ import annotations

import pytest
from worker_testing import make_assignment

from omnirt._internal.modes import ExecutionMode
from omnirt.worker.modes.events import RunRecorder, run_report, trace_id


@pytest.mark.parametrize(
    ("traceparent", "expected"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "4bf92f3577b34da6a3ce929d0e0e4736"),
        ("", ""),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736", ""),  # not version-traceid-spanid-flags
        ("00-a-b-01-extra", ""),
    ],
)
def test_the_trace_id_is_the_traceparents_second_field(traceparent: str, expected: str) -> None:
    assert trace_id({"traceparent": traceparent}) == expected
    assert trace_id({}) == ""


def test_a_report_takes_the_shared_facts_from_the_assignment_and_the_recorder() -> None:
    assignment = make_assignment(job_ids=("job-a", "job-b"))
    item = assignment.items[1]
    recorder = RunRecorder(lambda event: None)
    recorder.stage_finished([item.job_id], "denoise", recorder.started)
    report = run_report(
        assignment,
        item,
        recorder,
        worker_id="w-1",
        execution_mode=ExecutionMode.MODULAR,
        backend="cpu",
        device="cpu",
        seeds=(3, 4),
        peak_memory_bytes=5,
        config_resolved={"width": 64},
    )
    assert (report.job_id, report.model, report.task) == ("job-b", "tiny-sd", item.request.task)
    # A plain string, as the wire and the JSON report carry it.
    assert type(report.execution_mode) is str and report.execution_mode == "modular"
    assert (report.attempt, report.queue_wait_ms, report.batch_size) == (1, 12.5, 2)
    assert report.batch_group_id == "bg-1" and report.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert [timing.name for timing in report.timings] == ["denoise"]
    assert report.seeds == [3, 4] and report.cache_hits == {} and report.warnings == []
    assert report.started_at == recorder.started_at and report.started_at <= report.finished_at
    assert report.omnirt_version and len(report.run_id) == 36
