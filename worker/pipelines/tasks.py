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

import math
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


# The VAE's compression as the video pipelines name it: (spatial, temporal) attribute names,
# Wan/CogVideoX/HunyuanVideo's first, then LTX-Video's and Mochi's.
# Image pipelines (SD3, Flux, PixArt) name theirs plain `vae_scale_factor`, read last (Sana
# Video sets both names).
_SPATIAL_FACTORS = (
    "vae_scale_factor_spatial",
    "vae_spatial_compression_ratio",
    "vae_spatial_scale_factor",
    "vae_scale_factor",
)
_TEMPORAL_FACTORS = (
    "vae_scale_factor_temporal",
    "vae_temporal_compression_ratio",
    "vae_temporal_scale_factor",
)
# Pipelines that pad and trim to any frame count (Allegro's default is 88 frames).
_ANY_FRAME_COUNT = frozenset({"AllegroPipeline"})
# The diffusers pipeline packages whose pipelines round a frame count off the grid to the nearest
# one themselves (Wan makes 9 frames of 8, with a warning): their users may ask for any count, so
# they are not refused (the OpenAI video route asks for seconds x fps frames).
_ROUNDS_FRAMES = frozenset(
    {"wan", "skyreels_v2", "kandinsky5", "kandinsky6", "lucy", "chronoedit", "anyflow"}
)


def _takes_any_frame_count(pipeline: Any) -> bool:
    cls = type(pipeline)
    parts = cls.__module__.split(".")
    package = parts[2] if len(parts) > 2 and parts[:2] == ["diffusers", "pipelines"] else ""
    return cls.__name__ in _ANY_FRAME_COUNT or package in _ROUNDS_FRAMES


def _factor(pipeline: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(pipeline, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _image_processor_multiple(pipeline: Any) -> int:
    """The multiple the pipeline's own image processor sizes images to: Flux's is the VAE factor
    x 2, as it packs 2x2 latent patches into one token (its transformer's `patch_size` is 1)."""
    config = getattr(getattr(pipeline, "image_processor", None), "config", None)
    value = getattr(config, "vae_scale_factor", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def check_size(pipeline: Any, common: dict[str, Any]) -> None:
    """Refuse a width, height or frame count the pipeline cannot make (INVALID_ARGUMENT naming it).

    Width and height: a multiple of the spatial VAE factor times the transformer's spatial patch
    size (Wan: 8 x 2 from `(1, 2, 2)`; CogVideoX, HunyuanVideo and Mochi: 8 x their int
    `patch_size`; LTX-Video: 32 x 1; SD3: 8 x 2; Flux: 8 x 2 of its latent packing, the multiple
    of its image processor). Frames: k x the temporal VAE factor + 1 (Wan 4k+1, LTX-Video
    8k+1, Mochi 6k+1): off that grid the pipelines round (Wan, with a warning) or decode another
    count than asked (LTX-Video). Pipelines without the factors are left to themselves."""
    factor = _factor(pipeline, _SPATIAL_FACTORS)
    patch = getattr(getattr(getattr(pipeline, "transformer", None), "config", None), "patch_size", None)
    # Wan's patch is (frames, height, width); the others give one int for height and width.
    spatial_patch = patch[-1] if isinstance(patch, (list, tuple)) and patch else patch
    if factor is not None and isinstance(spatial_patch, int) and spatial_patch >= 1:
        multiple = math.lcm(factor * spatial_patch, _image_processor_multiple(pipeline))
        for name in ("width", "height"):
            value = common.get(name)
            if value and value % multiple:
                raise JobFailure(
                    "INVALID_ARGUMENT",
                    f"{name} must be a multiple of {multiple} for this model (got {value})",
                    name,
                )
    temporal = _factor(pipeline, _TEMPORAL_FACTORS)
    frames = common.get("num_frames")
    if temporal and frames and (frames - 1) % temporal and not _takes_any_frame_count(pipeline):
        raise JobFailure(
            "INVALID_ARGUMENT",
            f"num_frames must be {temporal}k+1 for this model (e.g. {(frames - 1) // temporal * temporal + 1}"
            f" or {((frames - 1) // temporal + 1) * temporal + 1}; got {frames})",
            "num_frames",
        )
