"""One loaded model, several tasks: the pipeline, arguments and outputs of each task.

A catalog entry names one pipeline class (the one its weights are loaded with). A request for
another task of the same model (image2image or inpaint on a text-to-image model) runs the
matching diffusers pipeline built with `from_pipe` from the loaded one: the same modules,
loaded once, no copy of the weights. Which class: the model's `runtime.task_pipelines` table
(`{image2image = "StableDiffusionImg2ImgPipeline"}`) when it names one, else diffusers'
`AutoPipelineForImage2Image` / `AutoPipelineForInpainting` mapping. Other tasks (text2image,
text2video, image2video) run the loaded pipeline as is.

Video tasks return frames: `output.frames` is split per output and exported as MP4 or GIF.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from omnirt import types as t
from omnirt.worker.export import image as export
from omnirt.worker.export import video as video_export
from omnirt.worker.modes.base import JobFailure

VIDEO_TASKS = frozenset({t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO, t.Task.AUDIO2VIDEO})
# Tasks whose pipeline is derived from the loaded one, and diffusers' auto class for them.
_DERIVED_TASKS = {
    t.Task.IMAGE2IMAGE: "AutoPipelineForImage2Image",
    t.Task.INPAINT: "AutoPipelineForInpainting",
}
# The catalog runtime key: task value -> diffusers pipeline class name.
RUNTIME_KEY = "task_pipelines"

_lock = threading.Lock()
# base pipeline -> {task: derived pipeline}; entries go when the cache drops the base pipeline.
_derived: weakref.WeakKeyDictionary[Any, dict[t.Task, Any]] = weakref.WeakKeyDictionary()


def is_video(task: t.Task) -> bool:
    """True when `task` produces a video."""
    return task in VIDEO_TASKS


def output_format(task: t.Task, name: str) -> str:
    """The normalized output format of `task` (png for images, mp4 for videos); ValueError if unsupported."""
    return video_export.video_format(name) if is_video(task) else export.image_format(name)


def _derive(pipeline: Any, task: t.Task, spec: t.ModelSpec) -> Any:
    import diffusers

    named = (spec.runtime.get(RUNTIME_KEY) or {}).get(task.value) if isinstance(spec.runtime, dict) else None
    try:
        if named:
            cls = getattr(diffusers, str(named), None)
            if not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
                raise ValueError(f"runtime.{RUNTIME_KEY}.{task.value} names no diffusers pipeline: {named!r}")
            derived = cls.from_pipe(pipeline)
        else:
            derived = getattr(diffusers, _DERIVED_TASKS[task]).from_pipe(pipeline)
    except (ValueError, TypeError, AttributeError) as exc:
        raise JobFailure(
            "FAILED_PRECONDITION",
            f"model {spec.id!r} ({type(pipeline).__name__}) has no {task.value} pipeline: {exc}",
            "task",
        ) from exc
    derived.set_progress_bar_config(disable=True)
    return derived


def pipeline_for_task(pipeline: Any, task: t.Task, spec: t.ModelSpec) -> Any:
    """The pipeline that runs `task` on the loaded `pipeline` (itself, or one sharing its modules)."""
    if task not in _DERIVED_TASKS:
        return pipeline
    with _lock:
        per_task = _derived.setdefault(pipeline, {})
        if task not in per_task:
            per_task[task] = _derive(pipeline, task, spec)
        return per_task[task]


def call_outputs(output: Any) -> list[Any]:
    """The outputs of a pipeline call, one per generated image or video."""
    if isinstance(output, tuple):
        return list(output[0])
    frames = getattr(output, "frames", None)
    if frames is not None:
        return list(frames)  # (videos, frames, height, width, channels) or a list of frame lists
    return list(output.images)


def output_artifact(
    output: Any, *, task: t.Task, index: int, seed: int, job_id: str, fmt: str, quality: int, fps: float
) -> t.Artifact:
    """The Artifact of one output: an encoded image, or a video (MP4/GIF) of its frames."""
    if is_video(task):
        return video_export.video_artifact(output, index=index, seed=seed, job_id=job_id, fmt=fmt, fps=fps)
    return export.image_artifact(output, index=index, seed=seed, job_id=job_id, fmt=fmt, quality=quality)


def finish_outputs(
    task: t.Task, outputs: list[Any], specific: dict[str, Any], runtime: dict[str, Any]
) -> list[Any]:
    """Post-process a call's outputs; for inpaint, keep the input's pixels outside the mask.

    Diffusers' inpaint pipelines blend in latent space, so even the unmasked area goes through
    the VAE and drifts from the input; pasting the input back where the mask is black (soft
    edges follow the mask's grey levels) is what users expect. `runtime.inpaint_overlay =
    false` turns it off.
    """
    image, mask = specific.get("image"), specific.get("mask_image")
    if task is not t.Task.INPAINT or image is None or mask is None or runtime.get("inpaint_overlay") is False:
        return outputs
    from PIL import Image

    finished = []
    for output in outputs:
        generated = export.to_pil(output).convert("RGB")
        original = image.convert("RGB").resize(generated.size, Image.Resampling.LANCZOS)
        alpha = mask.convert("L").resize(generated.size, Image.Resampling.NEAREST)
        finished.append(Image.composite(generated, original, alpha))
    return finished


def check_size(pipeline: Any, common: dict[str, Any]) -> None:
    """Refuse a width/height the pipeline cannot make: a multiple of the spatial VAE factor
    times the transformer's spatial patch size (Wan: 8 x 2 from `(1, 2, 2)`; CogVideoX and
    HunyuanVideo: 8 x their int `patch_size`). Pipelines without both are left to themselves."""
    factor = getattr(pipeline, "vae_scale_factor_spatial", None)
    patch = getattr(getattr(getattr(pipeline, "transformer", None), "config", None), "patch_size", None)
    # Wan's patch is (frames, height, width); the others give one int for height and width.
    spatial_patch = patch[-1] if isinstance(patch, (list, tuple)) and patch else patch
    if not isinstance(factor, int) or not isinstance(spatial_patch, int) or spatial_patch < 1:
        return
    multiple = factor * spatial_patch
    for name in ("width", "height"):
        value = common.get(name)
        if value and value % multiple:
            raise JobFailure(
                "INVALID_ARGUMENT",
                f"{name} must be a multiple of {multiple} for this model (got {value})",
                name,
            )
