"""Command lines -> the GenerateRequest the SDK sends, and usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnirt.cli.main import build_parser, main
from omnirt.cli.request_args import request_from_args
from omnirt.errors import InvalidRequest
from omnirt.types import Adapter, GenerateRequest, MediaInput, MediaRole, Task, Webhook, WebhookEvent


def _request(*argv: str) -> GenerateRequest:
    return request_from_args(build_parser().parse_args(["generate", *argv]))


def test_minimal_command_leaves_everything_else_unset() -> None:
    # no --task: the controller picks the model's first task
    assert _request("--model", "tiny-sd", "--prompt", "a fox") == GenerateRequest(
        model="tiny-sd", prompt="a fox"
    )


def test_every_flag_reaches_its_field(tmp_path: Path) -> None:
    image = tmp_path / "in.png"
    image.write_bytes(b"png")
    mask = tmp_path / "mask.png"
    mask.write_bytes(b"mask")
    req = _request(
        "-m", "tiny-sd", "-p", "a fox", "--task", "inpaint", "--negative-prompt", "blurry",
        "--width", "64", "--height", "48", "--steps", "4", "--guidance", "7.5", "--seed", "42",
        "--num-outputs", "2", "--preset", "fast", "--scheduler", "DDIM", "--priority", "10",
        "--timeout", "2.5", "--image", str(image), "--mask", str(mask), "--strength", "0.6",
        "--extra", '{"clip_skip": 2}', "--label", "team=a", "--label", "run=b=c",
        "--adapter", "style:0.5", "--adapter", "detail", "--idempotency-key", "k1",
        "--format", "webp", "--quality", "90",
    )  # fmt: skip
    assert req == GenerateRequest(
        model="tiny-sd",
        prompt="a fox",
        task=Task.INPAINT,
        negative_prompt="blurry",
        width=64,
        height=48,
        num_inference_steps=4,
        guidance_scale=7.5,
        seed=42,
        num_outputs=2,
        preset="fast",
        scheduler="DDIM",
        priority=10,
        timeout_ms=2500,
        strength=0.6,
        inputs=[
            MediaInput(MediaRole.IMAGE, b"png", mime_type="image/png"),
            MediaInput(MediaRole.MASK, b"mask", mime_type="image/png"),
        ],
        extra={"clip_skip": 2},
        labels={"team": "a", "run": "b=c"},
        adapters=[Adapter("style", 0.5), Adapter("detail", 1.0)],
        idempotency_key="k1",
        output_format="webp",
        quality=90,
    )


def test_json_and_controller_work_before_and_after_the_subcommand() -> None:
    parser = build_parser()
    before = parser.parse_args(["--json", "--controller", "h:1", "models", "list"])
    after = parser.parse_args(["models", "list", "--json", "-c", "h:2"])
    neither = parser.parse_args(["models", "list"])
    assert (before.json, before.controller) == (True, "h:1")
    assert (after.json, after.controller) == (True, "h:2")
    assert (neither.json, neither.controller) == (False, None)


def test_controller_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNIRT_CONTROLLER", "ctl:50051")
    assert build_parser().parse_args(["workers", "list"]).controller == "ctl:50051"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["generate", "--prompt", "x"], "--model"),
        (["generate", "-m", "m", "--extra", "[1]"], "must be a JSON object"),
        (["generate", "-m", "m", "--extra", "{nope"], "not valid JSON"),
        (["generate", "-m", "m", "--image", "/nonexistent.png"], "no such file"),
        (["generate", "-m", "m", "--task", "text2hologram"], "invalid choice"),
        (["generate", "-m", "m", "--timeout", "0"], "must be positive"),
        (["generate", "-m", "m", "--label", "novalue"], "KEY=VALUE"),
        (["jobs"], "COMMAND"),
        ([], "COMMAND"),
    ],
)
def test_usage_errors_exit_2(argv: list[str], complaint: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert complaint in err and "usage: omnirtctl" in err


def test_help_and_version_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "generate" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "omnirtctl 0.1.0"


def test_webhook_flags_build_the_requests_webhook() -> None:
    req = _request(
        "--model", "null", "--webhook", "https://h.example/x", "--webhook-events", "completed, failed"
    )
    assert req.webhook == Webhook("https://h.example/x", [WebhookEvent.COMPLETED, WebhookEvent.FAILED])
    assert _request("--model", "null", "--webhook", "https://h.example/x").webhook == Webhook(
        "https://h.example/x"
    )
    with pytest.raises(InvalidRequest) as caught:
        _request("--model", "null", "--webhook", "https://h.example/x", "--webhook-events", "done")
    assert caught.value.field == "webhook.events"
