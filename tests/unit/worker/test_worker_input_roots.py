"""`file://` inputs: refused unless the worker has `--input-roots`, read only inside them, bounded.

Before, a `file://` URI read any file the worker could open (`/etc/shadow`'s size showed in the
error, `/dev/zero` was read until memory ran out).
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from worker_testing import run_assignment, run_script_job

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.failures import JobFailure
from omnirt.worker.main import load_config
from omnirt.worker.modes.legacy_call import LegacyCallExecutor
from omnirt.worker.pipelines import media_inputs

NOT_ALLOWED = "inputs[0].uri: file:// inputs are not allowed on this worker"
NOT_FOUND = "inputs[0].uri: not found under the worker's input roots"


def png(path: Path, colour: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), colour).save(buf, format="PNG")
    path.write_bytes(buf.getvalue())
    return path


def image2image(executor: LegacyCallExecutor, uri: str, max_input_bytes: int = 0) -> ItemOutcome:
    """One tiny-sd image2image job whose init image is `uri` (the model's limits.max_input_bytes)."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-uri",
        model=models_pb2.ModelSpec(
            id="tiny-sd",
            source="builtin:tiny-sd",
            pipeline_class="StableDiffusionPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_IMAGE2IMAGE],
            limits=models_pb2.ModelLimits(max_input_bytes=max_input_bytes),
        ),
    )
    request = types_pb2.GenerateRequest(
        task=types_pb2.TASK_IMAGE2IMAGE, model="tiny-sd", prompt="a fox", width=64, height=64,
        num_inference_steps=2, seed=3, strength=0.5,
    )  # fmt: skip
    request.inputs.add(role=types_pb2.MEDIA_ROLE_IMAGE, uri=uri)
    msg.items.add(job_id="job-uri", attempt=1, request=request)
    [outcome], _ = run_assignment(executor, assignment_from_proto(msg))
    return outcome


def refusal(outcome: ItemOutcome) -> str:
    assert outcome.error is not None, "the input was read"
    assert (outcome.error.code, outcome.error.field) == ("INVALID_ARGUMENT", "inputs[0].uri")
    return outcome.error.message


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "inputs"


def with_roots(executor: LegacyCallExecutor, *roots: Path, max_bytes: int = 0) -> LegacyCallExecutor:
    """An executor sharing `executor`'s model cache, with `--input-roots` (and `--input-max-bytes`)."""
    config = WorkerConfig(
        model_dir=executor.config.model_dir,
        worker_id="w-roots",
        torch_threads=1,
        input_roots=[str(r) for r in roots],
        **({"input_max_bytes": max_bytes} if max_bytes else {}),
    )
    return LegacyCallExecutor(config, cache=executor.cache)


def test_without_input_roots_file_uris_are_refused(executor: LegacyCallExecutor, tmp_path: Path) -> None:
    image = png(tmp_path / "fox.png")
    assert refusal(image2image(executor, image.as_uri())) == NOT_ALLOWED
    assert refusal(image2image(executor, "file:///etc/shadow")) == NOT_ALLOWED


def test_an_image_under_an_input_root_is_read(executor: LegacyCallExecutor, root: Path) -> None:
    image = png(root / "sub" / "fox.png")
    outcome = image2image(with_roots(executor, root), image.as_uri())
    assert outcome.error is None, outcome.error
    assert outcome.result is not None and outcome.result.report.pipeline_class.endswith("Img2ImgPipeline")


def test_outside_missing_dotdot_and_links_out_get_one_answer(
    executor: LegacyCallExecutor, root: Path, tmp_path: Path
) -> None:
    outside = png(tmp_path / "outside" / "secret.png")
    png(root / "fox.png")
    (root / "link.png").symlink_to(outside)
    (root / "dir-link").symlink_to(outside.parent, target_is_directory=True)
    served = with_roots(executor, root)
    uris = [
        outside.as_uri(),  # exists, outside
        (root / "missing.png").as_uri(),  # inside, missing
        (tmp_path / "missing.png").as_uri(),  # outside, missing
        f"file://{root}/../outside/secret.png",  # climbs out
        (root / "link.png").as_uri(),  # a link pointing out
        (root / "dir-link" / "secret.png").as_uri(),  # through a folder link pointing out
        "file:///etc/shadow",
        "file:///etc/passwd",
        "file:///dev/zero",
        f"file://{root}/fox.png%00.txt",  # a NUL byte
        "file://otherhost/" + str(root / "fox.png"),
    ]
    messages = {uri: refusal(image2image(served, uri)) for uri in uris}
    assert set(messages.values()) == {NOT_FOUND}, messages


def test_non_regular_files_are_refused_without_reading(executor: LegacyCallExecutor, root: Path) -> None:
    root.mkdir()
    os.mkfifo(root / "pipe")  # opening it for reading would block until a writer came
    started = time.monotonic()
    message = refusal(image2image(with_roots(executor, root), (root / "pipe").as_uri()))
    assert "not a regular file" in message and str(root) not in message
    message = refusal(image2image(with_roots(executor, Path("/dev")), "file:///dev/zero"))
    assert "not a regular file" in message
    # A folder (the root itself too) is refused the same way, and leaves no file descriptor open.
    (root / "folder").mkdir()
    open_fds = len(os.listdir("/proc/self/fd"))
    for folder in (root / "folder", root):
        message = refusal(image2image(with_roots(executor, root), folder.as_uri()))
        assert "not a regular file" in message, message
    assert len(os.listdir("/proc/self/fd")) == open_fds
    assert time.monotonic() - started < 30


def test_reads_are_bounded_by_input_max_bytes(executor: LegacyCallExecutor, root: Path) -> None:
    image = png(root / "fox.png")
    size = image.stat().st_size
    message = refusal(image2image(with_roots(executor, root, max_bytes=size - 1), image.as_uri()))
    assert f"over the limit of {size - 1} bytes" in message
    # The model's limit, when it is smaller, bounds the read too.
    message = refusal(image2image(with_roots(executor, root), image.as_uri(), max_input_bytes=size - 2))
    assert f"over the limit of {size - 2} bytes" in message
    # A 64 GiB sparse file is refused at once, never read into memory.
    huge = root / "huge.png"
    with huge.open("wb") as f:
        f.truncate(64 * 1024**3)
    message = refusal(image2image(with_roots(executor, root), huge.as_uri()))
    assert "over the limit" in message and str(root) not in message


def test_http_uris_are_not_fetched(executor: LegacyCallExecutor, root: Path) -> None:
    for uri in ("https://example.com/fox.png", "http://169.254.169.254/latest/meta-data"):
        message = refusal(image2image(with_roots(executor, root), uri))
        assert message.startswith("inputs[0].uri: ") and "inline data or file://" in message


def test_input_roots_come_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert WorkerConfig().input_roots == []
    config = load_config(["--input-roots", f"{tmp_path}/a,~/b", "--input-max-bytes", "1000"])
    assert config.input_roots == [str(tmp_path / "a"), os.path.expanduser("~/b")]
    assert config.input_max_bytes == 1000
    monkeypatch.setenv("OMNIRT_INPUT_ROOTS", str(tmp_path))
    assert load_config([]).input_roots == [str(tmp_path)]
    with pytest.raises(ValueError, match="input_max_bytes"):
        WorkerConfig(input_max_bytes=0)


# ---- the subprocess mode writes inputs into its job folder: same rules --------------------------

SAVE_INPUT = """
    import json, os, shutil
    from pathlib import Path
    request = json.loads(Path(os.environ["OMNIRT_REQUEST"]).read_text())
    shutil.copy(request["inputs"]["image"], Path(os.environ["OMNIRT_OUTPUT_DIR"]) / "copy.png")
"""


def subprocess_job(tmp_path: Path, uri: str, roots: list[Path]) -> ItemOutcome:
    request = t.GenerateRequest(
        model="script-model", task=t.Task.IMAGE2IMAGE, inputs=[t.MediaInput(role=t.MediaRole.IMAGE, uri=uri)]
    )
    return run_script_job(
        tmp_path, "save.py", SAVE_INPUT, request, worker_id="w-sub-uri", input_roots=[str(r) for r in roots]
    )


def test_the_subprocess_mode_follows_the_input_roots(tmp_path: Path, root: Path) -> None:
    image = png(root / "fox.png")
    assert refusal(subprocess_job(tmp_path, image.as_uri(), [])) == NOT_ALLOWED
    assert refusal(subprocess_job(tmp_path, "file:///etc/passwd", [root])) == NOT_FOUND
    outcome = subprocess_job(tmp_path, image.as_uri(), [root])
    assert outcome.error is None, outcome.error
    assert outcome.result is not None and outcome.result.artifacts[0].data == image.read_bytes()


# ---- races and odd names: read_uri itself --------------------------------------------------------


def test_a_folder_swapped_for_a_link_after_the_check_is_not_followed_out(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path is checked resolved, then opened: a folder on it replaced by a link to elsewhere in
    between (a writer of the root racing the worker) must not lead the open out of the roots."""
    png(root / "sub" / "fox.png")
    secret = png(tmp_path / "outside" / "fox.png", colour=(1, 2, 3))
    policy = media_inputs.InputPolicy(roots=(root.resolve(),))
    real_realpath = os.path.realpath

    def realpath_then_swap(path: Any, *args: Any, **kwargs: Any) -> Any:
        resolved = real_realpath(path, *args, **kwargs)
        if str(path).endswith("sub/fox.png"):  # checked: now swap the folder under the worker
            (root / "sub").rename(root / "sub-old")
            (root / "sub").symlink_to(secret.parent, target_is_directory=True)
        return resolved

    monkeypatch.setattr(media_inputs.os.path, "realpath", realpath_then_swap)
    with pytest.raises(JobFailure) as refused:
        read = media_inputs.read_uri((root / "sub" / "fox.png").as_uri(), "inputs[0]", policy)
        assert read != secret.read_bytes(), "the file outside the roots was read"
    assert refused.value.error.message == NOT_FOUND


def test_the_models_input_limit_bounds_a_requests_files_together(root: Path) -> None:
    """`limits.max_input_bytes` is "bytes of one request's inputs together": 16 files each just
    under it were 16 times that in memory (and in the subprocess mode's job folder)."""
    fox, mask = png(root / "fox.png"), png(root / "mask.png", colour=(255, 255, 255))
    size = fox.stat().st_size
    spec = t.ModelSpec(id="m", limits=t.ModelLimits(max_input_bytes=size + size // 2))
    policy = media_inputs.InputPolicy(roots=(root.resolve(),)).for_model(spec)
    inputs = [
        t.MediaInput(role=t.MediaRole.IMAGE, uri=fox.as_uri()),
        t.MediaInput(role=t.MediaRole.MASK, uri=mask.as_uri()),
    ]
    request = t.GenerateRequest(model="m", inputs=inputs)
    for read in (
        lambda: media_inputs.with_uris_read(request, policy),  # the subprocess mode
        lambda: media_inputs.image_inputs(
            inputs, {t.MediaRole.IMAGE: "image", t.MediaRole.MASK: "mask"}, None, policy
        ),
    ):
        with pytest.raises(JobFailure) as refused:
            read()
        assert refused.value.error.field == "inputs[1].uri"
        assert "over the limit" in refused.value.error.message and "together" in refused.value.error.message
    # Each alone fits; inline bytes count against the same total.
    assert media_inputs.with_uris_read(t.GenerateRequest(model="m", inputs=inputs[:1]), policy).inputs[0].data
    inline = [t.MediaInput(role=t.MediaRole.IMAGE, data=fox.read_bytes()), inputs[1]]
    with pytest.raises(JobFailure, match="over the limit"):
        media_inputs.with_uris_read(t.GenerateRequest(model="m", inputs=inline), policy)


def test_a_uri_python_cannot_parse_is_the_clients_error(root: Path) -> None:
    # urlparse raises ValueError on an unclosed IPv6 host: the job failed INTERNAL with it.
    policy = media_inputs.InputPolicy(roots=(root.resolve(),))
    for uri in ("file://[/x", "https://[::1/x"):
        with pytest.raises(JobFailure) as refused:
            media_inputs.read_uri(uri, "inputs[0]", policy)
        assert refused.value.error.code == "INVALID_ARGUMENT" and refused.value.error.field == "inputs[0].uri"
