"""The error line and the run report line people read."""

from __future__ import annotations

from sdk_fake_server import sample_result

from omnirt import errors
from omnirt.cli.output import error_line, fmt_ms, report_line
from omnirt.types import StageTiming


def test_error_line_has_code_and_message() -> None:
    err = errors.InvalidRequest("width: must be a multiple of 8 (got 65)", field="width")
    assert error_line(err) == "error: INVALID_ARGUMENT: width: must be a multiple of 8 (got 65)"


def test_error_line_adds_the_field_only_when_the_message_lacks_it() -> None:
    err = errors.InvalidRequest("must be a multiple of 8 (got 65)", field="height")
    assert error_line(err) == "error: INVALID_ARGUMENT: height: must be a multiple of 8 (got 65)"
    assert error_line(errors.ModelNotFound("unknown model 'x'")) == "error: NOT_FOUND: unknown model 'x'"


def test_error_line_shows_the_retry_hint() -> None:
    err = errors.QueueFull("queue is full", retry_after_s=2)
    assert error_line(err) == "error: RESOURCE_EXHAUSTED: queue is full (retry after 2 s)"


def test_report_line() -> None:
    result = sample_result()
    assert report_line(result, elapsed_s=1.1) == (
        "tiny-sd text2image 64x64 · 4 steps · seed 42 · worker w-1 · queue 3 ms · "
        "load 812 ms (cold) · denoise 150 ms · total 1.10 s"
    )


def test_report_line_of_a_warm_batched_multi_output_run() -> None:
    result = sample_result()
    report = result.report
    report.cold_start, report.batch_size, report.seeds = False, 4, [7, 8]
    report.timings = [StageTiming("denoise", 2500.0)]
    result.artifacts.append(result.artifacts[0])
    assert report_line(result) == (
        "tiny-sd text2image 64x64 · 4 steps · seeds 7-8 · 2 outputs · worker w-1 · batch 4 · "
        "queue 3 ms · denoise 2.50 s · total 1.00 s"
    )


def test_report_line_gives_the_size_that_was_made_not_the_one_asked() -> None:
    result = sample_result()  # asked 64x64
    result.report.model = "null"
    result.artifacts[0].width = result.artifacts[0].height = 8  # null's dot
    assert report_line(result).startswith("null text2image 8x8 · ")


def test_fmt_ms() -> None:
    assert [fmt_ms(3.2), fmt_ms(999.4), fmt_ms(1234)] == ["3 ms", "999 ms", "1.23 s"]
