"""One loaded model, several tasks: the pipeline, arguments and outputs of each task.

A catalog entry names one pipeline class (the one its weights are loaded with). A request for
another task of the same model (image2image or inpaint on a text-to-image model) runs the
matching diffusers pipeline built with `from_pipe` from the loaded one: the same modules,
loaded once, no copy of the weights. Which class: the model's `runtime.task_pipelines` table
(`{image2image = "StableDiffusionImg2ImgPipeline"}`) when it names one, else diffusers'
`AutoPipelineForImage2Image` / `AutoPipelineForInpainting` mapping. image2video on a
text-to-video model whose image-to-video pipeline takes the same modules (LTX-Video's, Wan 2.2
TI2V-5B's) runs that one, built the same way. Other tasks (text2image, text2video, image2video
on an image-to-video model), and a task whose family pipeline the model is loaded as (Kandinsky
5's image-to-image one), run the loaded pipeline as is.

Video tasks return frames: `output.frames` is split per output and exported as MP4 or GIF.
Audio tasks return waveforms: `output.audios` (Stable Audio's, AudioLDM 2's), one clip per
output at the VAE's (or the vocoder's) sample rate, exported as WAV, FLAC or MP3.
"""

from __future__ import annotations

import math
import threading
import weakref
from typing import Any

from omnirt import types as t
from omnirt._internal import families
from omnirt.worker.export import audio as audio_export
from omnirt.worker.export import image as export
from omnirt.worker.export import video as video_export
from omnirt.worker.failures import JobFailure

VIDEO_TASKS = frozenset({t.Task.TEXT2VIDEO, t.Task.IMAGE2VIDEO, t.Task.AUDIO2VIDEO})
AUDIO_TASKS = frozenset({t.Task.TEXT2AUDIO})
# Stable Audio's clip window in seconds: the request's duration_ms is its end, from 0.
AUDIO_START, AUDIO_END = "audio_start_in_s", "audio_end_in_s"
# AudioLDM 2's clip length in seconds: the request's duration_ms.
AUDIO_LENGTH = "audio_length_in_s"
# Tasks whose pipeline is derived from the loaded one, and diffusers' auto class for them.
_DERIVED_TASKS = {
    t.Task.IMAGE2IMAGE: "AutoPipelineForImage2Image",
    t.Task.INPAINT: "AutoPipelineForInpainting",
}
# Text-to-video pipelines -> their image-to-video pipeline on the same modules (diffusers has no
# auto class for image2video); image2video on another model runs the loaded pipeline.
_IMAGE2VIDEO = {"LTXPipeline": "LTXImageToVideoPipeline"}
# The catalog runtime key: task value -> diffusers pipeline class name.
RUNTIME_KEY = "task_pipelines"

_lock = threading.Lock()
# base pipeline -> {task: derived pipeline}; entries go when the cache drops the base pipeline.
_derived: weakref.WeakKeyDictionary[Any, dict[t.Task, Any]] = weakref.WeakKeyDictionary()


def is_video(task: t.Task) -> bool:
    """True when `task` produces a video."""
    return task in VIDEO_TASKS


def is_audio(task: t.Task) -> bool:
    """True when `task` produces audio."""
    return task in AUDIO_TASKS


def output_format(task: t.Task, name: str) -> str:
    """The normalized output format of `task` (png for images, mp4 for videos, wav for audio);
    ValueError if unsupported."""
    if is_audio(task):
        return audio_export.audio_format(name)
    return video_export.video_format(name) if is_video(task) else export.image_format(name)


def _image2video_class(pipeline: Any) -> str | None:
    """The image-to-video pipeline class on the modules of text-to-video `pipeline`, if any.

    A `WanPipeline` has one only when its config says `expand_timesteps` (Wan 2.2 TI2V-5B: the
    image's latents replace the first latent frame); Wan 2.1's and the A14B's transformers take
    no image channels."""
    name = type(pipeline).__name__
    if name == "WanPipeline":
        config = getattr(pipeline, "config", None)
        expands = isinstance(config, dict) and bool(config.get("expand_timesteps"))
        return "WanImageToVideoPipeline" if expands else None
    return _IMAGE2VIDEO.get(name)


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
            auto = _DERIVED_TASKS.get(task) or _image2video_class(pipeline) or ""
            derived = getattr(diffusers, auto).from_pipe(pipeline)
    except (ValueError, TypeError, AttributeError) as exc:
        raise JobFailure(
            "FAILED_PRECONDITION",
            f"model {spec.id!r} ({type(pipeline).__name__}) has no {task.value} pipeline: {exc}",
            "task",
        ) from exc
    derived.set_progress_bar_config(disable=True)
    return derived


def _is_task_pipeline(pipeline: Any, task: t.Task, spec: t.ModelSpec) -> bool:
    """Whether `pipeline` is a family table's own pipeline for `task` (and the model's runtime names
    none): a model loaded as Kandinsky 5's image-to-image pipeline, which no diffusers auto class
    knows, runs image2image as it is."""
    if isinstance(spec.runtime, dict) and (spec.runtime.get(RUNTIME_KEY) or {}).get(task.value):
        return False
    return type(pipeline).__name__ in {f.pipelines.get(task) for f in families.builtin().values()}


def pipeline_for_task(pipeline: Any, task: t.Task, spec: t.ModelSpec) -> Any:
    """The pipeline that runs `task` on the loaded `pipeline` (itself, or one sharing its modules)."""
    image2video = task is t.Task.IMAGE2VIDEO and _image2video_class(pipeline) is not None
    if (task not in _DERIVED_TASKS and not image2video) or _is_task_pipeline(pipeline, task, spec):
        return pipeline
    with _lock:
        per_task = _derived.setdefault(pipeline, {})
        if task not in per_task:
            per_task[task] = _derive(pipeline, task, spec)
        return per_task[task]


def call_outputs(output: Any, pipeline: Any = None) -> list[Any]:
    """The outputs of a pipeline call, one per generated image, video or clip (a `Waveform` at
    `pipeline`'s sample rate)."""
    if isinstance(output, tuple):
        return list(output[0])
    frames = getattr(output, "frames", None)
    if frames is not None:
        return list(frames)  # (videos, frames, height, width, channels) or a list of frame lists
    audios = getattr(output, "audios", None)
    if audios is not None:  # (clips, channels, samples)
        rate = sample_rate(pipeline)
        return [audio_export.waveform(clip, rate) for clip in audios]
    images = getattr(output, "images", None)
    # Kandinsky 5's image pipelines name theirs `image` (a list all the same).
    return list(images if images is not None else output.image)


def output_artifact(
    output: Any, *, task: t.Task, index: int, seed: int, job_id: str, fmt: str, quality: int, fps: float
) -> t.Artifact:
    """The Artifact of one output: an encoded image, a video (MP4/GIF) of its frames, or a clip."""
    if is_audio(task):
        return audio_export.audio_artifact(output, index=index, seed=seed, job_id=job_id, fmt=fmt)
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
# Pipelines that round a frame count off their grid to the nearest one themselves (Wan makes 9
# frames of 8, with a warning): their users may ask for any count, so it is not refused (the
# OpenAI video route asks for seconds x fps frames). The family table says which of its
# pipelines do (`rounds_frames`); these diffusers packages round too but have no family there.
_ROUNDS_FRAMES_UNLISTED = frozenset({"kandinsky6", "lucy", "chronoedit", "anyflow"})
# Pipelines that need a least frame count: Kandinsky 5's image-to-video one renormalises its
# first 4 latent frames against the ones after them (`normalize_first_frame`), which makes NaN
# frames with fewer than 5 latent frames (17 frames) and raises a Python error with one.
_MIN_FRAMES = {"Kandinsky5I2VPipeline": 17}


def _takes_any_frame_count(pipeline: Any) -> bool:
    cls = type(pipeline)
    parts = cls.__module__.split(".")
    package = parts[2] if len(parts) > 2 and parts[:2] == ["diffusers", "pipelines"] else ""
    return (
        cls.__name__ in _ANY_FRAME_COUNT
        or cls.__name__ in families.rounding_pipelines()
        or package in _ROUNDS_FRAMES_UNLISTED
    )


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


# Pipelines that rescale every request to one pixel area, keeping its aspect ratio and rounding
# each side down to their multiple: HiDream-I1's area is its `default_sample_size` (128) x the
# VAE factor, squared (1024 x 1024); it would make 1024x1024 of a 512x512 request, without a word.
_FIXED_AREA = frozenset({"HiDreamImagePipeline"})


def _check_fixed_area(pipeline: Any, common: dict[str, Any], multiple: int) -> None:
    sample, factor = getattr(pipeline, "default_sample_size", None), _factor(pipeline, ("vae_scale_factor",))
    if type(pipeline).__name__ not in _FIXED_AREA or not isinstance(sample, int) or factor is None:
        return
    side = sample * factor
    width, height = common.get("width") or side, common.get("height") or side
    # The pipeline's own arithmetic, in its order (floats alike): scale to the area, round down.
    scale = math.sqrt(side**2 / (width * height))
    asked = {"width": width, "height": height}
    made = {name: int(value * scale // multiple * multiple) for name, value in asked.items()}
    for name, value in asked.items():
        if made[name] != value:
            reason = (
                f"this model makes images of {side}x{side} pixels in area (any aspect ratio): "
                f"{width}x{height} would come out {made['width']}x{made['height']}; ask for that size"
            )
            raise JobFailure("INVALID_ARGUMENT", reason, name)


def _check_listed_sizes(pipeline: Any, common: dict[str, Any]) -> None:
    """A pipeline that makes only the sizes it lists (Kandinsky 5's image pipelines, as
    `resolutions` of (width, height)) would resize any other to the nearest aspect ratio."""
    sizes = getattr(pipeline, "resolutions", None)
    width, height = common.get("width"), common.get("height")
    if not isinstance(sizes, list) or not sizes or width is None or height is None:
        return
    if (width, height) not in [tuple(size) for size in sizes]:
        listed = ", ".join(f"{w}x{h}" for w, h in sizes)
        reason = f"this model makes only these sizes: {listed} (got {width}x{height})"
        raise JobFailure(
            "INVALID_ARGUMENT", reason, "width" if width not in {w for w, _ in sizes} else "height"
        )


def check_size(pipeline: Any, common: dict[str, Any]) -> None:
    """Refuse a width, height or frame count the pipeline cannot make (INVALID_ARGUMENT naming it).

    Width and height: a multiple of the spatial VAE factor times the transformer's spatial patch
    size (Wan: 8 x 2 from `(1, 2, 2)`; CogVideoX, HunyuanVideo and Mochi: 8 x their int
    `patch_size`; LTX-Video: 32 x 1; SD3: 8 x 2; Flux: 8 x 2 of its latent packing, the multiple
    of its image processor; Qwen-Image: 8 x 2; UNet pipelines, SD to Kolors: 8 x 1). Frames:
    k x the temporal VAE factor + 1 (Wan 4k+1, LTX-Video 8k+1, Mochi 6k+1): off that grid the
    pipelines round (Wan, with a warning) or decode another count than asked (LTX-Video).
    Pipelines without the factors are left to themselves. A pipeline that makes one pixel area
    (HiDream-I1) refuses a size it would rescale; one that lists its sizes (Kandinsky 5's image
    pipelines) refuses any other; Kandinsky 5's image-to-video pipeline, fewer than 17 frames."""
    factor = _factor(pipeline, _SPATIAL_FACTORS)
    patch = getattr(getattr(getattr(pipeline, "transformer", None), "config", None), "patch_size", None)
    # Wan's patch is (frames, height, width); the others give one int for height and width.
    spatial_patch = patch[-1] if isinstance(patch, (list, tuple)) and patch else patch
    if patch is None and getattr(pipeline, "unet", None) is not None:
        spatial_patch = 1  # a UNet takes any latent size: SD, SDXL, Kolors and SVD want 8 x 1
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
        _check_fixed_area(pipeline, common, multiple)
    _check_listed_sizes(pipeline, common)
    temporal = _factor(pipeline, _TEMPORAL_FACTORS)
    frames = common.get("num_frames")
    if temporal and frames and (frames - 1) % temporal and not _takes_any_frame_count(pipeline):
        raise JobFailure(
            "INVALID_ARGUMENT",
            f"num_frames must be {temporal}k+1 for this model (e.g. {(frames - 1) // temporal * temporal + 1}"
            f" or {((frames - 1) // temporal + 1) * temporal + 1}; got {frames})",
            "num_frames",
        )
    least = _MIN_FRAMES.get(type(pipeline).__name__)
    if least and frames and frames < least:
        reason = f"num_frames must be at least {least} for this model (got {frames})"
        raise JobFailure("INVALID_ARGUMENT", reason, "num_frames")


def _config_number(module: Any, name: str) -> int | float | None:
    value = getattr(getattr(module, "config", None), name, None)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def sample_rate(pipeline: Any) -> int:
    """The sample rate of the pipeline's audio (its VAE's, Stable Audio's Oobleck; else its
    vocoder's, AudioLDM 2's HiFi-GAN), 0 if it has none."""
    vae, vocoder = getattr(pipeline, "vae", None), getattr(pipeline, "vocoder", None)
    for value in (
        getattr(pipeline, "sampling_rate", None),  # a transformers TTS model's own (speech.py)
        getattr(vae, "sampling_rate", None),
        _config_number(vae, "sampling_rate"),
        _config_number(vocoder, "sampling_rate"),
    ):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def max_duration_ms(pipeline: Any) -> int | None:
    """The longest clip the pipeline makes, in whole milliseconds; None when it does not say.

    Stable Audio denoises the transformer's `sample_size` latents, each the VAE's `hop_length`
    samples (Stable Audio Open: 1024 x 2048 / 44100 Hz = 47.55 s), and conditions on the end
    second through its projection model, which takes at most `max_value` seconds: the pipeline
    raises ValueError past either. Computed in integers; a duration_ms up to it passes the
    pipeline's own float comparison (both sides are one correctly rounded division).
    """
    latents = _config_number(getattr(pipeline, "transformer", None), "sample_size")
    hop = getattr(getattr(pipeline, "vae", None), "hop_length", None)
    rate = sample_rate(pipeline)
    if not (isinstance(latents, int) and isinstance(hop, int) and rate):
        return None
    longest = latents * hop * 1000 // rate
    top = _config_number(getattr(pipeline, "projection_model", None), "max_value")
    return longest if top is None else min(longest, math.floor(top * 1000))


def min_duration_ms(pipeline: Any) -> float:
    """The shortest clip the pipeline makes, in milliseconds (0 when it does not say).

    AudioLDM 2 raises ValueError under one latent frame: the VAE's factor x the vocoder's hop
    (its upsampling rates' product) / the sample rate (tiny-audioldm2: 2 x 160 / 16000 Hz = 20 ms)."""
    rates = getattr(getattr(getattr(pipeline, "vocoder", None), "config", None), "upsample_rates", None)
    factor, rate = getattr(pipeline, "vae_scale_factor", None), sample_rate(pipeline)
    if not (isinstance(rates, list | tuple) and isinstance(factor, int) and rate):
        return 0.0
    return math.prod(rates) * factor * 1000 / rate


def check_audio(pipeline: Any, task: t.Task, specific: dict[str, Any], fmt: str) -> None:
    """Refuse, before the call, an audio job the pipeline cannot make or its format cannot hold.

    `duration_ms` (as `specific`'s `audio_end_in_s`, or AudioLDM 2's `audio_length_in_s`) must
    give at least one sample, at least `min_duration_ms` and at most `max_duration_ms`;
    `output.format` must take the sample rate and channels (MP3 has fixed rates).
    INVALID_ARGUMENT naming the field; FAILED_PRECONDITION for an audio pipeline whose sample rate
    is unknown (no artifact could say it)."""
    if not is_audio(task):
        return
    rate = sample_rate(pipeline)
    if not rate:
        reason = f"{type(pipeline).__name__} has no VAE sample rate; OmniRT cannot export its audio"
        raise JobFailure("FAILED_PRECONDITION", reason, "task")
    channels = _config_number(getattr(pipeline, "vae", None), "audio_channels")
    problem = audio_export.format_problem(fmt, rate, int(channels or 1))
    if problem:
        raise JobFailure("INVALID_ARGUMENT", f"output.format: {problem}", "output.format")
    end = specific.get(AUDIO_END, specific.get(AUDIO_LENGTH))
    if end is None:
        return
    requested = round(end * 1000)
    shortest = min_duration_ms(pipeline)
    if end * 1000 < shortest:
        reason = f"duration_ms must be at least {math.ceil(shortest)} for this model (got {requested})"
        raise JobFailure("INVALID_ARGUMENT", reason, "duration_ms")
    longest = max_duration_ms(pipeline)
    if longest is not None and requested > longest:
        reason = f"duration_ms must be at most {longest} for this model (got {requested})"
        raise JobFailure("INVALID_ARGUMENT", reason, "duration_ms")
    if int(end * rate) < 1:  # the pipeline keeps samples [0, int(end * rate)) of the decoded clip
        reason = f"duration_ms {requested} is shorter than one sample at {rate} Hz"
        raise JobFailure("INVALID_ARGUMENT", reason, "duration_ms")
