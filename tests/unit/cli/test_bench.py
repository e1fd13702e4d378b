"""`omnirtctl bench` without a controller: its statistics, its request files and its flag errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnirt.cli.bench_requests import RequestFileError, load_requests
from omnirt.cli.bench_stats import UNFINISHED, Sample, bench_report, percentile
from omnirt.cli.main import main
from omnirt.types import MediaRole, Task
from tests.daemons import free_port

# ---- statistics ---------------------------------------------------------------------------


def test_percentiles_are_observed_values_by_nearest_rank() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # order does not matter
    assert [percentile(values, p) for p in (50, 95, 99, 100)] == [50.0, 95.0, 99.0, 100.0]
    assert percentile([7.0], 99) == 7.0
    assert percentile([1.0, 2.0], 50) == 1.0
    assert percentile([], 50) is None


def ok(latency_s: float, *, batch: int = 1, ttfp_s: float | None = 0.01, queue_ms: float = 2.0) -> Sample:
    return Sample(
        latency_s=latency_s,
        ok=True,
        ttfp_s=ttfp_s,
        queue_wait_ms=queue_ms,
        execution_ms=5.0,
        batch_size=batch,
    )


def failed(status: str, message: str = "") -> Sample:
    return Sample(latency_s=0.001, ok=False, status=status, message=message)


def test_report_counts_failures_by_status_and_keeps_them_out_of_latency() -> None:
    samples = [
        ok(0.1, batch=2),
        ok(0.2, batch=2, ttfp_s=None),
        ok(0.3, batch=0),  # a report without a batch size ran alone
        ok(0.4),
        failed("RESOURCE_EXHAUSTED", "queue is full"),
        failed("RESOURCE_EXHAUSTED", "queue is full again"),
        failed(UNFINISHED, "job j had not ended"),
    ]
    report = bench_report(samples, planned=10, wall_s=2.0, stopped_by="duration")
    assert (report["planned"], report["total"], report["ok"], report["failed"], report["not_sent"]) == (
        10,
        7,
        4,
        3,
        3,
    )
    assert report["failures"] == {"RESOURCE_EXHAUSTED": 2, UNFINISHED: 1}
    assert list(report["failures"]) == ["RESOURCE_EXHAUSTED", UNFINISHED]  # most frequent first
    assert report["failure_examples"] == {
        "RESOURCE_EXHAUSTED": "queue is full",
        UNFINISHED: "job j had not ended",
    }
    assert report["throughput_per_s"] == 2.0  # ok requests per second of the window
    latency = report["latency_ms"]
    assert (latency["count"], latency["p50"], latency["p99"], latency["max"]) == (4, 200.0, 400.0, 400.0)
    assert latency["mean"] == 250.0
    assert report["ttfp_ms"]["count"] == 3  # one request reported no progress
    assert report["queue_wait_ms"]["p50"] == 2.0
    assert report["batch_size_mean"] == 1.5 and report["batched_share"] == 0.5
    assert report["stopped_by"] == "duration"


def test_report_of_nothing_measured_has_no_numbers() -> None:
    report = bench_report([failed("INVALID_ARGUMENT")], planned=1, wall_s=0.0, stopped_by="total")
    assert report["latency_ms"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
        "mean": None,
        "max": None,
    }
    assert report["batch_size_mean"] is None and report["batched_share"] is None
    assert report["throughput_per_s"] == 0.0
    json.dumps(report)  # the --json output is plain JSON


# ---- request files --------------------------------------------------------------------------


def write(tmp_path: Path, text: str, name: str = "requests.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_json_lines_with_short_enums_and_camel_case(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '{"model": "tiny-sd", "prompt": "a", "task": "text2image", "numInferenceSteps": 2, "seed": 7}\n'
        "\n"
        '{"model": "null", "task": "INPAINT", "inputs": [{"role": "mask", "data": "AAE="}], '
        '"extra": {"sleep_ms_per_step": 5}, "output": {"format": "webp"}, "labels": {"k": "v"}}\n',
    )
    first, second = load_requests(path)
    assert (first.model, first.task, first.num_inference_steps, first.seed) == (
        "tiny-sd",
        Task.TEXT2IMAGE,
        2,
        7,
    )
    assert first.width is None  # unset stays unset: the model's defaults apply
    assert (second.task, second.inputs[0].role, second.inputs[0].data) == (
        Task.INPAINT,
        MediaRole.MASK,
        b"\x00\x01",
    )
    assert (second.extra, second.output_format, second.labels) == (
        {"sleep_ms_per_step": 5},
        "webp",
        {"k": "v"},
    )


def test_one_pretty_printed_object_or_an_array(tmp_path: Path) -> None:
    one = write(tmp_path, json.dumps({"model": "null", "prompt": "x"}, indent=2), "one.json")
    assert [r.model for r in load_requests(one)] == ["null"]
    many = write(tmp_path, json.dumps([{"model": "a"}, {"model": "b"}], indent=2), "many.json")
    assert [r.model for r in load_requests(many)] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"model": "null"}\n{"model": "null"\n', "line 2: not valid JSON"),
        ('{"model": "null"}\n{"model": "null", "colour": 1}\n', "line 2: colour: unknown field"),
        ('{"prompt": "x"}', "line 1: model: required"),
        ('{"model": "null", "task": "painting"}', "line 1: task: Invalid enum value painting"),
        ('{"model": "null", "width": "wide"}', "line 1: width: "),
        ('{"model": "null", "output": {"format": "png", "size": 3}}', "line 1: output.size: unknown field"),
        ('[{"model": "null"}, 3]', "request 2: expected a JSON object"),
        ("\n\n", "no requests in it"),
    ],
)
def test_bad_request_files_say_where(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(RequestFileError) as info:
        load_requests(write(tmp_path, text))
    assert words in str(info.value)


# ---- the command's own errors: no request is sent -------------------------------------------


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    # Nothing listens at this address: each of these must fail before calling it.
    status = main(["--controller", f"127.0.0.1:{free_port()}", "bench", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "error: give --model (and the other request flags) or --request-file"),
        (
            ["--request-file", "{file}", "--model", "null", "--seed", "1"],
            "replaces the request flags (got --model",
        ),
        (["--request-file", "{missing}"], "cannot read it (No such file or directory)"),
        (["--request-file", "{bad}"], "line 1: model: required"),
    ],
)
def test_flag_and_file_errors_are_one_line_and_status_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], words: str
) -> None:
    paths = {
        "{file}": str(write(tmp_path, '{"model": "null"}')),
        "{missing}": str(tmp_path / "missing.jsonl"),
        "{bad}": str(write(tmp_path, '{"prompt": "x"}', "bad.json")),
    }
    status, out, err = bench(capsys, *[paths.get(a, a) for a in argv])
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and words in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-m", "null", "--concurrency", "0"], "--concurrency: must be at least 1"),
        (["-m", "null", "--total", "many"], "--total: not a whole number"),
        (["-m", "null", "--duration", "0"], "--duration: must be positive"),
        (["-m", "null", "--grace", "-1"], "--grace: must be zero or more"),
    ],
)
def test_bad_load_flags_are_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    status, out, err = bench(capsys, *argv)
    assert status == 2 and out == "" and words in err
