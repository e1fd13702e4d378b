"""Bad input that reaches a worker is the client's error, named by its field, and never shows the
worker's folders. Before, each of these was INTERNAL with a Python exception's text: a 300-character
adapter name ("File name too long: '/.../models/aaa...'"), `extra.clip_skip = 99` (IndexError),
`extra.guidance_rescale = "x"` (TypeError). A controller of an older version does not check them,
and only the worker knows the real model (its text encoder's depth)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from options_testing import pixels, report, run_job
from worker_testing import run_script_job

from omnirt import types as t
from omnirt._internal.protocol.messages import AssignmentItem, ItemOutcome
from omnirt.worker.config import WorkerConfig
from omnirt.worker.failures import JobFailure
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines.args import ItemPlan, check_arguments
from omnirt.worker.redact import redact_paths


def refused(outcome: ItemOutcome, code: str, field: str) -> str:
    """The error's message, after checking its code and field (and that it starts with the field)."""
    assert outcome.error is not None, "the job ran"
    assert (outcome.error.code, outcome.error.field) == (code, field), outcome.error
    assert outcome.error.message.startswith(field + ": "), outcome.error.message
    return outcome.error.message


def test_an_overlong_adapter_name_is_invalid_argument_without_the_model_dir(
    executor: LegacyCallExecutor,
) -> None:
    model_dir = executor.config.model_dir
    for name in ("a" * 300, "loras/" + "b" * 256 + "/x", "fox\x00.safetensors", "fox\nbar"):
        message = refused(run_job(executor, adapters=[name]), "INVALID_ARGUMENT", "adapters[0].name")
        assert model_dir not in message and len(message) < 300, message
    assert report(run_job(executor)).cold_start in (True, False)  # still serving


def test_adapter_refusals_do_not_list_the_worker_folders(executor: LegacyCallExecutor) -> None:
    outcome = run_job(executor, adapters=["no-such-adapter"])
    assert outcome.error is not None and outcome.error.code == "INVALID_ARGUMENT"
    assert outcome.error.field == "adapters[0]"
    assert executor.config.model_dir not in outcome.error.message, outcome.error.message
    assert "no-such-adapter" in outcome.error.message


def test_an_adapter_path_outside_the_folders_gets_the_answer_of_a_missing_one(
    executor: LegacyCallExecutor, tmp_path: Path
) -> None:
    # Otherwise a client learns which files the worker has: "/etc/shadow is outside" against
    # "/etc/nope is neither a catalog adapter nor a path".
    (Path(executor.config.model_dir) / "link-out").symlink_to(tmp_path)
    answers = set()
    for name in ("/etc/shadow", "/etc/no-such-file", str(tmp_path), "link-out", "no-such-adapter"):
        message = refused(run_job(executor, adapters=[name]), "INVALID_ARGUMENT", "adapters[0]")
        answers.add(re.sub(r"'[^']*'", "NAME", message))  # the name as echoed (and redacted)
    assert len(answers) == 1, answers


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (99, "extra.clip_skip: at most 1 for this model's text encoder (got 99)"),
        (2, "extra.clip_skip: at most 1 for this model's text encoder (got 2)"),
        (-1, "extra.clip_skip: at least 0 (got -1)"),
        ("x", "extra.clip_skip: an integer (got 'x')"),
        (1.5, "extra.clip_skip: an integer (got 1.5)"),
        (True, "extra.clip_skip: an integer (got True)"),
    ],
)
def test_clip_skip_is_checked_against_the_text_encoder(
    executor: LegacyCallExecutor, value: Any, reason: str
) -> None:
    outcome = run_job(executor, extra={"clip_skip": value})
    assert refused(outcome, "INVALID_ARGUMENT", "extra.clip_skip") == reason


def test_clip_skip_skips_text_encoder_layers_and_is_reported(executor: LegacyCallExecutor) -> None:
    # transformers 5 flattened CLIPTextModel, where diffusers' SD pipelines reach into
    # `text_encoder.text_model` to skip: the call's view of the encoder has one (`clip_skip.py`).
    plain = run_job(executor, seed=5)
    skipped = [run_job(executor, seed=5, extra={"clip_skip": 1}) for _ in range(2)]
    none_skipped = run_job(executor, seed=5, extra={"clip_skip": 0})
    assert report(skipped[0]).config_resolved["clip_skip"] == 1
    # tiny-sd's text encoder has 2 layers: the prompt's states after layer 1, not 2, make another
    # image (a mean of 8 to 14 levels over seeds 5, 7, 11; a clip_skip that never reached the
    # encoder, 0).
    assert np.abs(pixels(skipped[0]) - pixels(plain)).mean() > 3
    # The same again: a second call skips as the first (no state left behind by the first).
    assert np.abs(pixels(skipped[1]) - pixels(skipped[0])).max() == 0
    # 0 skips no layer: the last layer's states through the final norm are the usual embeddings.
    assert np.abs(pixels(none_skipped) - pixels(plain)).max() == 0


def test_the_text_model_is_the_calls_alone(model_dir: Path) -> None:
    """diffusers' LoRA loader keeps a checkpoint's `text_model.` key prefix for an encoder that
    has a `text_model`: the loaded pipeline's encoder never gets one."""
    import copy

    from diffusers import StableDiffusionPipeline

    from omnirt.worker.pipelines.clip_skip import text_model_view

    pipeline = StableDiffusionPipeline.from_pretrained(model_dir / "tiny-sd")
    encoder = pipeline.text_encoder
    view = copy.copy(pipeline)
    with text_model_view(view, {"clip_skip": None}):
        assert view.text_encoder is encoder
    with text_model_view(view, {"clip_skip": 1}):
        assert view.text_encoder.text_model is encoder
        assert view.text_encoder.final_layer_norm is encoder.final_layer_norm
        assert not hasattr(pipeline.text_encoder, "text_model") and not hasattr(encoder, "text_model")
    assert view.text_encoder is encoder


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("x", "extra.guidance_rescale: a number from 0 to 1 (got 'x')"),
        (2, "extra.guidance_rescale: a number from 0 to 1 (got 2)"),
        (-0.5, "extra.guidance_rescale: a number from 0 to 1 (got -0.5)"),
        ([0.5], "extra.guidance_rescale: a number from 0 to 1 (got [0.5])"),
    ],
)
def test_guidance_rescale_is_a_number_from_0_to_1(
    executor: LegacyCallExecutor, value: Any, reason: str
) -> None:
    outcome = run_job(executor, extra={"guidance_rescale": value})
    assert refused(outcome, "INVALID_ARGUMENT", "extra.guidance_rescale") == reason


def test_a_number_argument_given_text_is_invalid_argument(executor: LegacyCallExecutor) -> None:
    # Any argument whose default is a number: `eta` (DDIM's noise) here.
    outcome = run_job(executor, extra={"eta": "lots"})
    assert refused(outcome, "INVALID_ARGUMENT", "extra.eta") == "extra.eta: a number (got 'lots')"
    assert report(run_job(executor, extra={"guidance_rescale": 0.5, "eta": 0})).config_resolved["eta"] == 0


class ControlNetLike:
    """The signature of diffusers' ControlNet pipelines: a number, or one per ControlNet."""

    def __call__(
        self,
        prompt: str = "",
        num_inference_steps: int = 50,
        controlnet_conditioning_scale: float | list[float] = 1.0,
    ) -> None:
        raise AssertionError("not called")


def extras_checked(pipeline: Any, **extra: Any) -> JobFailure | None:
    plan = ItemPlan(AssignmentItem("job", t.GenerateRequest(model="m", extra=extra)), 1, [1], "png", "")
    plan.specific = dict(extra)
    try:
        check_arguments(pipeline, plan)
    except JobFailure as failure:
        return failure
    return None


def test_a_list_for_an_argument_that_takes_one_number_per_controlnet_is_accepted() -> None:
    # Multi-ControlNet: `controlnet_conditioning_scale=[0.5, 0.8]` was "extra...: a number".
    from diffusers import StableDiffusionControlNetPipeline

    # This file's annotations are strings; diffusers' own are typing objects: both are read.
    for pipeline in (ControlNetLike(), object.__new__(StableDiffusionControlNetPipeline)):
        assert extras_checked(pipeline, controlnet_conditioning_scale=[0.5, 0.8]) is None
        assert extras_checked(pipeline, controlnet_conditioning_scale=0.5) is None
        for key, value in [
            ("controlnet_conditioning_scale", "x"),
            ("controlnet_conditioning_scale", [0.5, "x"]),
            ("num_inference_steps", [4]),
        ]:
            failure = extras_checked(pipeline, **{key: value})
            assert failure is not None and failure.error.field == f"extra.{key}", (key, value)


def test_a_model_that_fails_to_load_says_so_without_the_model_dir(
    executor: LegacyCallExecutor, tmp_path: Path
) -> None:
    models = tmp_path / "models"
    shutil.copytree(Path(executor.config.model_dir) / "tiny-sd", models / "tiny-sd")
    (models / "tiny-sd" / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"broken")
    broken = LegacyCallExecutor(WorkerConfig(model_dir=str(models), worker_id="w-broken", torch_threads=1))
    outcome = run_job(broken)
    assert outcome.error is not None and outcome.error.code == "FAILED_PRECONDITION"
    message = outcome.error.message
    assert message.startswith("cannot load model 'tiny-sd' from 'builtin:tiny-sd': "), message
    assert str(tmp_path) not in message and "/" + "models" not in message, message


def test_redact_paths_keeps_last_names_and_urls() -> None:
    text = "no file named model.safetensors in /srv/omnirt/models/tiny-sd; see https://hf.co/a/b or ~/x/y"
    assert redact_paths(text, {"/srv/omnirt/models": "MODEL_DIR"}) == (
        "no file named model.safetensors in MODEL_DIR/tiny-sd; see https://hf.co/a/b or .../y"
    )
    kept = redact_paths("no weights in /srv/sd15/unet/x.bin", keep=["/srv/sd15"])
    assert kept == "no weights in /srv/sd15/unet/x.bin"  # a catalog source is public
    assert redact_paths("[Errno 36] File name too long: '/home/svc/.cache/aaa'") == (
        "[Errno 36] File name too long: '.../aaa'"
    )


def test_redact_paths_cuts_a_folder_that_only_starts_like_a_known_one() -> None:
    # `/srv/models2` is not MODEL_DIR (`/srv/models`), nor `/srv/sd15-private` the kept source.
    assert redact_paths("cannot open /srv/models2/secret/x.bin", {"/srv/models": "MODEL_DIR"}) == (
        "cannot open .../x.bin"
    )
    assert redact_paths("no /srv/sd15-private/unet/x.bin", keep=["/srv/sd15"]) == "no .../x.bin"
    assert redact_paths("in /srv/models", {"/srv/models": "MODEL_DIR"}) == "in MODEL_DIR"
    # Nor is a folder that only ends like one: `/data/srv/sd15` is neither the source nor MODEL_DIR.
    assert redact_paths("missing /data/srv/sd15", keep=["/srv/sd15"]) == "missing .../sd15"
    assert redact_paths("in /data/srv/models", {"/srv/models": "MODEL_DIR"}) == "in .../models"


def test_redact_paths_cuts_the_path_of_a_file_uri_and_leaves_non_paths() -> None:
    assert redact_paths("cannot read file:///srv/in/secret/x.png") == "cannot read file://.../x.png"
    text = "steps 1/2 of org/name (https://hf.co/org/name/blob/x), ratio 16/9, a / b"
    assert redact_paths(text, keep=["org/name"]) == text


# ---- the subprocess mode: a failing command's log tail and a missing script ---------------------

FAILS = """
    import os, sys
    print("working in", os.environ["OMNIRT_JOB_DIR"], flush=True)
    sys.exit(3)
"""


def subprocess_job(tmp_path: Path, command: str) -> ItemOutcome:
    source = FAILS if command == "fails.py" else ""  # another name is a script that is not there
    request = t.GenerateRequest(model="script", prompt="x")
    return run_script_job(tmp_path, command, source, request, worker_id="w-sub-bad")


def test_subprocess_errors_do_not_show_the_worker_folders(tmp_path: Path) -> None:
    failed = subprocess_job(tmp_path, "fails.py")
    assert failed.error is not None and failed.error.code == "INTERNAL"
    assert "exited with status 3" in failed.error.message and "working in" in failed.error.message
    assert str(tmp_path) not in failed.error.message, failed.error.message
    missing = subprocess_job(tmp_path, "missing.py")
    assert missing.error is not None and missing.error.code == "FAILED_PRECONDITION"
    assert "missing.py" in missing.error.message and str(tmp_path) not in missing.error.message
