"""Helpers for the worker unit tests (a uniquely named module: test folders have no __init__.py)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import textwrap
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from PIL import Image

from omnirt import types as t
from omnirt._internal.protocol.convert import assignment_from_proto
from omnirt._internal.protocol.messages import Assignment, AssignmentItem, ItemOutcome
from omnirt._internal.protocol.v1 import gateway_pb2
from omnirt.v1 import models_pb2, types_pb2
from omnirt.worker.config import WorkerConfig
from omnirt.worker.modes.base import create_executor
from omnirt.worker.modes.executor import CancelFlags
from omnirt.worker.modes.legacy_call import LegacyCallExecutor


def make_assignment(
    *,
    job_ids: tuple[str, ...] = ("job-1",),
    source: str = "builtin:tiny-sd",
    steps: int = 4,
    seed: int = 7,
    num_outputs: int = 1,
    deadline_ms: int = 0,
    scheduler: str = "",
    model_id: str = "tiny-sd",
) -> Assignment:
    """An Assignment built the way the controller sends it (a proto), converted like the daemon does."""
    msg = gateway_pb2.Assignment(
        assignment_id="as-" + "-".join(job_ids),
        model=models_pb2.ModelSpec(
            id=model_id,
            source=source,
            pipeline_class="StableDiffusionPipeline",
            execution_mode="legacy_call",
            tasks=[types_pb2.TASK_TEXT2IMAGE],
        ),
        deadline_ms=deadline_ms,
        batch_group_id="bg-1" if len(job_ids) > 1 else "",
        trace_context={"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    )
    for index, job_id in enumerate(job_ids):
        msg.items.add(
            job_id=job_id,
            attempt=1,
            queue_wait_ms=12.5,
            request=types_pb2.GenerateRequest(
                task=types_pb2.TASK_TEXT2IMAGE,
                model=model_id,
                prompt=f"a watercolor fox number {index}",
                negative_prompt="blurry",
                width=64,
                height=64,
                num_inference_steps=steps,
                guidance_scale=5.0,
                seed=seed + 100 * index,
                num_outputs=num_outputs,
                scheduler=scheduler,
                output=types_pb2.OutputOptions(format="png"),
            ),
        )
    return assignment_from_proto(msg)


def run_assignment(
    executor: LegacyCallExecutor, assignment: Assignment, flags: CancelFlags | None = None, on_event=None
) -> tuple[list[ItemOutcome], list]:
    """Run on an event loop like the daemon does; return the outcomes and the events in order."""
    events: list = []
    flags = flags or CancelFlags()

    def emit(event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event, flags)

    async def go() -> list[ItemOutcome]:
        return await executor.run(assignment, emit, flags)

    outcomes = asyncio.run(go())
    return outcomes, events


def run_script_job(
    tmp_path: Path, script: str, source: str, request: t.GenerateRequest, **config: Any
) -> ItemOutcome:
    """One job of the model `request.model` in the subprocess mode, whose command is `script`
    (written from `source` into the worker's script folder; a name with no source is left out)."""
    scripts = tmp_path / "scripts"
    scripts.mkdir(exist_ok=True)
    if source:
        (scripts / script).write_text(textwrap.dedent(source))
    worker = WorkerConfig(
        mode="subprocess", model_dir=str(tmp_path / "models"), script_dirs=[str(scripts)], **config
    )
    spec = t.ModelSpec(
        id=request.model, tasks=[request.task or t.Task.TEXT2IMAGE], execution_mode="subprocess",
        runtime={"command": script},
    )  # fmt: skip
    [outcome], _ = run_assignment(
        create_executor(worker), Assignment("as-script", spec, [AssignmentItem("job-script", request)])
    )
    return outcome


# ---- one job on a tiny model family ----------------------------------------------------------

TASKS = {task: types_pb2.Task.Value(f"TASK_{task.name}") for task in t.Task}
IMAGE = types_pb2.MEDIA_ROLE_IMAGE
MASK = types_pb2.MEDIA_ROLE_MASK
AUDIO = types_pb2.MEDIA_ROLE_AUDIO


@dataclass(frozen=True)
class Family:
    """A tiny builtin model as the controller would describe it in an Assignment."""

    model: str
    pipeline_class: str
    tasks: tuple[t.Task, ...]
    # The request's fields when a test gives none (size, frames, steps, guidance, seed).
    defaults: dict[str, Any] = field(default_factory=dict)


def run_family(
    executor: LegacyCallExecutor, family: Family, task: t.Task | None = None, **fields: Any
) -> ItemOutcome:
    """One job of `task` (the family's first by default) on builtin `family.model`."""
    [outcome], _ = run_assignment(executor, family_assignment(family, task, **fields))
    return outcome


def family_assignment(
    family: Family,
    task: t.Task | None = None,
    *,
    prompt: str = "a red fox",
    inputs: tuple[tuple[int, bytes], ...] = (),
    extra: dict[str, Any] | None = None,
    **fields: object,
) -> Assignment:
    """The Assignment of one job `job-1` of `task` on builtin `family.model`."""
    task = task or family.tasks[0]
    msg = gateway_pb2.Assignment(
        assignment_id=f"as-{family.model}",
        model=models_pb2.ModelSpec(
            id=family.model,
            source=f"builtin:{family.model}",
            pipeline_class=family.pipeline_class,
            execution_mode="legacy_call",
            tasks=[TASKS[x] for x in family.tasks],
        ),
    )
    request = types_pb2.GenerateRequest(
        task=TASKS[task], model=family.model, prompt=prompt, **{**family.defaults, **fields}
    )
    for role, data in inputs:
        request.inputs.add(role=role, data=data)
    if extra:
        request.extra.update(extra)
    msg.items.add(job_id="job-1", attempt=1, request=request)
    return assignment_from_proto(msg)


def only_result(outcome: ItemOutcome | list[ItemOutcome]) -> t.GenerateResult:
    """The result of a job that must have succeeded (one outcome, or a list of one)."""
    if isinstance(outcome, list):
        [outcome] = outcome
    assert outcome.error is None, outcome.error
    assert outcome.result is not None
    return outcome.result


def refusal(outcome: ItemOutcome) -> tuple[str, str]:
    """(code, field) of a job that must have failed."""
    assert outcome.error is not None, "the job ran"
    return outcome.error.code, outcome.error.field


def png_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def noise_image(seed: int, size: tuple[int, int] = (64, 64)) -> Image.Image:
    rgb = np.random.RandomState(seed).randint(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    return Image.fromarray(rgb)


def pixels(artifact: t.Artifact) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(artifact.data)).convert("RGB"), dtype=np.float32)


def decoded_frames(data: bytes) -> np.ndarray:
    """A video's frames as one (frames, height, width, 3) uint8 array."""
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


# What each video this process encoded was made from: id(encoded bytes) -> (those bytes, the
# frames), the newest 512. By identity, not digest: two pipelines' frames that differ by 1/255
# can encode to the same MP4 bytes.
_PRODUCED: OrderedDict[int, tuple[bytes, np.ndarray]] = OrderedDict()


@contextmanager
def recording_produced_frames() -> Iterator[None]:
    """Record what every video encoded in this process was made from (`produced_frames`).

    An "equals legacy_call" comparison must look at what the pipelines produced, not at frames
    decoded from two lossy MP4 encodings: x264 turns a 1/255 difference between two CPUs' float
    kernels into 12/255 in the decoded frames (seen on an Intel Xeon against a bound of 2).
    """
    from omnirt.worker.export import video

    encode: Callable[[Any, str, float], bytes] = video.encode_video

    def recorded(frames: Any, fmt: str, fps: float) -> bytes:
        data = encode(frames, fmt, fps)
        _PRODUCED[id(data)] = (data, np.array(frames, copy=True))
        while len(_PRODUCED) > 512:
            _PRODUCED.popitem(last=False)
        return data

    video.encode_video = recorded
    try:
        yield
    finally:
        video.encode_video = encode


def produced_frames(artifact: t.Artifact) -> np.ndarray:
    """The (frames, height, width, 3) uint8 frames a video artifact was encoded from."""
    data, frames = _PRODUCED.get(id(artifact.data), (b"", None))
    assert data is artifact.data and frames is not None, "the video was not encoded in this process"
    return frames


def pixel_difference(a: t.GenerateResult, b: t.GenerateResult) -> float:
    """Mean absolute pixel difference of two results' first artifacts (images or videos)."""

    def values(result: t.GenerateResult) -> np.ndarray:
        artifact = result.artifacts[0]
        if artifact.kind is t.MediaKind.VIDEO:
            return decoded_frames(artifact.data).astype(np.float32)
        return pixels(artifact)

    return float(np.abs(values(a) - values(b)).mean())


def check_image(artifact: t.Artifact, width: int, height: int) -> None:
    """A PNG of `width` x `height` with its own digest, and not a flat image."""
    assert (artifact.kind, artifact.mime_type, artifact.width, artifact.height) == (
        t.MediaKind.IMAGE,
        "image/png",
        width,
        height,
    )
    assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
    image = pixels(artifact)
    assert image.shape == (height, width, 3)
    assert np.std(image) > 1, "not a flat image"


def check_video(artifact: t.Artifact, width: int, height: int, frames: int, fps: float = 8.0) -> None:
    """An MP4 of `frames` frames of `width` x `height` at `fps`, its own digest, not flat."""
    assert (artifact.kind, artifact.mime_type) == (t.MediaKind.VIDEO, "video/mp4")
    made = (artifact.width, artifact.height, artifact.num_frames, artifact.fps)
    assert made == (width, height, frames, fps)
    assert artifact.sha256 == hashlib.sha256(artifact.data).hexdigest()
    decoded = decoded_frames(artifact.data)
    assert decoded.shape == (frames, height, width, 3)
    assert np.std(decoded.astype(np.float32)) > 1, "not a flat video"


def check_seeded(
    results: dict[str, t.GenerateResult], same: str = "again", other: str = "other-seed"
) -> None:
    """`results["first"]` and `results[same]` (one seed) are the same bytes; `results[other]`
    (another seed) other bytes, visibly (more than 1 of 255 on average)."""
    first = results["first"].artifacts[0]
    assert first.sha256 == results[same].artifacts[0].sha256
    assert first.sha256 != results[other].artifacts[0].sha256
    assert pixel_difference(results["first"], results[other]) > 1
