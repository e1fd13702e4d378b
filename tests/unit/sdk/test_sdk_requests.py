"""Keyword arguments -> GenerateRequest, as every Client method builds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnirt import errors
from omnirt._internal.requests import artifact_file_name, build_request, media_input, request_from_json
from omnirt.types import (
    Adapter,
    Artifact,
    GenerateRequest,
    MediaInput,
    MediaKind,
    MediaRole,
    Task,
    Webhook,
    WebhookEvent,
)


def test_keywords_build_a_request_and_none_means_unset() -> None:
    req = build_request(
        model="tiny-sd", prompt="a fox", task="text2image", width=64, seed=None, scheduler=None
    )
    assert req == GenerateRequest(model="tiny-sd", prompt="a fox", task=Task.TEXT2IMAGE, width=64)
    assert req.task is Task.TEXT2IMAGE


def test_media_shortcuts_take_bytes_paths_and_uris(tmp_path: Path) -> None:
    mask = tmp_path / "mask.png"
    mask.write_bytes(b"mask-bytes")
    req = build_request(model="m", task="inpaint", image=b"img", mask=mask, audio="https://x.test/a.wav")
    assert req.inputs == [
        MediaInput(role=MediaRole.IMAGE, data=b"img"),
        MediaInput(role=MediaRole.MASK, data=b"mask-bytes", mime_type="image/png"),
        MediaInput(role=MediaRole.AUDIO, uri="https://x.test/a.wav"),
    ]
    assert media_input("image", str(mask)).data == b"mask-bytes"


def test_adapters_by_name() -> None:
    req = build_request(model="m", adapters=["style", Adapter("detail", 0.5)])
    assert req.adapters == [Adapter("style", 1.0), Adapter("detail", 0.5)]


def test_request_plus_keywords_is_a_copy() -> None:
    base = GenerateRequest(model="tiny-sd", prompt="a fox", inputs=[MediaInput(MediaRole.IMAGE, b"x")])
    req = build_request(base, seed=7, mask=b"m")
    assert (req.seed, req.prompt, len(req.inputs)) == (7, "a fox", 2)
    assert base.seed is None and len(base.inputs) == 1


def test_unknown_field_and_missing_model_are_type_errors() -> None:
    with pytest.raises(TypeError, match="steps"):
        build_request(model="m", steps=4)
    with pytest.raises(TypeError, match="model"):
        build_request(prompt="a fox")


def test_unknown_task_is_an_invalid_request_naming_the_field() -> None:
    with pytest.raises(errors.InvalidRequest) as info:
        build_request(model="m", task="text2hologram")
    assert info.value.field == "task"
    assert "text2image" in info.value.message


def test_artifact_file_names_never_escape_the_folder() -> None:
    art = Artifact(index=1, kind=MediaKind.IMAGE, mime_type="image/png", file_name="../../etc/x.png")
    assert artifact_file_name("job-9", art) == "x.png"
    art.file_name = ""
    assert artifact_file_name("job-9", art) == "job-9-1.png"


def test_webhook_keywords() -> None:
    req = build_request(model="null", webhook="https://h.example/x", webhook_events=["completed", "failed"])
    assert req.webhook == Webhook("https://h.example/x", [WebhookEvent.COMPLETED, WebhookEvent.FAILED])
    hook = Webhook("https://h.example/y", progress_interval_ms=500)
    req = build_request(model="null", webhook=hook, webhook_events="progress")
    assert req.webhook == Webhook("https://h.example/y", [WebhookEvent.PROGRESS], 500)
    assert hook.events == []  # the caller's Webhook is not changed
    with pytest.raises(errors.InvalidRequest) as caught:
        build_request(model="null", webhook="https://h.example/x", webhook_events=["finished"])
    assert caught.value.field == "webhook.events"
    with pytest.raises(TypeError, match="webhook="):
        build_request(model="null", webhook_events=["completed"])


def test_json_in_the_proto3_mapping_makes_a_request() -> None:
    req = request_from_json(
        {
            "model": "tiny-sd",
            "task": "inpaint",  # a short enum name, any case
            "numInferenceSteps": 2,  # lowerCamelCase
            "inputs": [{"role": "MEDIA_ROLE_MASK", "data": "AAE="}],  # bytes as base64
            "extra": {"clip_skip": 1},
        }
    )
    assert (req.model, req.task, req.num_inference_steps, req.extra) == (
        "tiny-sd",
        Task.INPAINT,
        2,
        {"clip_skip": 1},
    )
    assert req.inputs == [MediaInput(role=MediaRole.MASK, data=b"\x00\x01")]
    assert req.width is None  # unset stays unset


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"prompt": "x"}, "model: required"),
        ({"model": "m", "colour": 1}, "colour: unknown field"),
        ({"model": "m", "output": {"size": 3}}, "output.size: unknown field"),
        ({"model": "m", "task": "painting"}, "task: Invalid enum value painting"),
        ([{"model": "m"}], "expected a JSON object, got list"),
    ],
)
def test_json_that_is_not_a_request_says_which_field(data: object, words: str) -> None:
    with pytest.raises(ValueError, match="^" + words):
        request_from_json(data)
