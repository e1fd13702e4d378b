"""From a resolved request to diffusers pipeline arguments.

`plan_item` checks what can be checked without the model (output format, scheduler name,
seeds); `pipeline_kwargs` adds what needs the loaded pipeline (its call signature decides
which extras and media inputs it takes). Every refusal is a `JobFailure` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnirt import types as t
from omnirt._internal import batching, defaults
from omnirt._internal.limits import ECHO_CHARS
from omnirt._internal.protocol.messages import AssignmentItem
from omnirt._internal.tasks import REQUIRED_INPUTS
from omnirt.worker.export import video as video_export
from omnirt.worker.failures import JobFailure
from omnirt.worker.pipelines import extra_types, media_inputs, speech
from omnirt.worker.pipelines import tasks as task_pipelines

INVALID_ARGUMENT = "INVALID_ARGUMENT"

# Request media roles -> the pipeline argument that takes them.
MEDIA_ARGUMENTS = {
    t.MediaRole.IMAGE: "image",
    t.MediaRole.MASK: "mask_image",
    t.MediaRole.CONTROL_IMAGE: "control_image",
}
# Arguments the executor sets itself; a request's extras may not override them.
RESERVED_ARGUMENTS = frozenset(
    {
        "prompt",
        "negative_prompt",
        "num_images_per_prompt",
        "generator",
        "callback_on_step_end",
        "callback_on_step_end_tensor_inputs",
        "callback",
        "callback_steps",
        "output_type",
        "return_dict",
        "latents",
        "prompt_embeds",
        "negative_prompt_embeds",
    }
)


@dataclass(frozen=True)
class CallArgument:
    """How one of the executor's generic call arguments reaches a pipeline's `__call__`."""

    # The pipeline's names for it, in order: the first one its `__call__` takes gets the value.
    names: tuple[str, ...]
    # The request field refused (INVALID_ARGUMENT) when the pipeline takes none of `names` and
    # the value is not `neutral`; "" when such a value is dropped (the pipeline decides it).
    field: str = ""
    neutral: Any = None
    # A name taken only by a pipeline that takes none of `names`; elsewhere it stays an argument
    # of its own, which a request's extras may set (Flux.1-dev's `true_cfg_scale`).
    fallback: str = ""


# Qwen-Image's (and Flux's, HunyuanVideo's) classifier-free guidance with a negative prompt.
TRUE_CFG = "true_cfg_scale"

# The executor's generic arguments -> the pipeline's names for them. One table for every
# family: a pipeline's signature (`call_parameters`) picks the name, none is tried by calling.
CALL_ARGUMENTS: dict[str, CallArgument] = {
    # Stable Video Diffusion takes no prompt at all: its input image is its only condition.
    "prompt": CallArgument(("prompt",), "prompt", neutral=""),
    "negative_prompt": CallArgument(("negative_prompt",), "negative_prompt", neutral=""),
    # Video pipelines count their outputs in videos, Stable Audio in waveforms.
    "num_images_per_prompt": CallArgument(
        ("num_images_per_prompt", "num_videos_per_prompt", "num_waveforms_per_prompt"),
        "num_outputs",
        neutral=1,
    ),
    # SVD ramps its guidance over the frames, from `min_guidance_scale` (1) to this. Pipelines
    # with a `true_cfg_scale` take `guidance_scale` only for a guidance-distilled transformer
    # (`call_parameters`): on Qwen-Image the request's guidance is its `true_cfg_scale`.
    "guidance_scale": CallArgument(
        ("guidance_scale", "max_guidance_scale"), "guidance_scale", fallback=TRUE_CFG
    ),
    # Pipelines without a size (image-to-image) take that of their input, already resized to it.
    "width": CallArgument(("width",)),
    "height": CallArgument(("height",)),
    "num_frames": CallArgument(("num_frames",)),
    # The video's frame rate: SVD, Cosmos and SkyReels-V2 diffusion forcing condition on it, LTX as
    # `frame_rate` (its RoPE's time scale); others only export at it.
    "fps": CallArgument(("fps", "frame_rate")),
}
# The table's other names are set from request fields too (`max_guidance_scale` is the
# request's guidance_scale on SVD): extras may not set them either.
RESERVED_ARGUMENTS |= {"fps", *(name for rule in CALL_ARGUMENTS.values() for name in rule.names[1:])}
# Stable Audio's clip window and AudioLDM 2's clip length, set from the request's duration_ms
# (`audio_arguments`).
AUDIO_START, AUDIO_END = task_pipelines.AUDIO_START, task_pipelines.AUDIO_END
AUDIO_LENGTH = task_pipelines.AUDIO_LENGTH
RESERVED_ARGUMENTS |= {AUDIO_START, AUDIO_END, AUDIO_LENGTH}


def call_kwargs(generic: dict[str, Any], accepted: Set[str]) -> dict[str, Any]:
    """`generic` call arguments under the names the pipeline takes (`CALL_ARGUMENTS`).

    An argument the pipeline takes under none of its names is dropped: `check_call_arguments`
    refused, at planning, every such value that would change the output.
    """
    kwargs: dict[str, Any] = {}
    for key, value in generic.items():
        rule = CALL_ARGUMENTS.get(key)
        if rule is None:  # the pipeline's own arguments and media inputs, checked by name already
            kwargs[key] = value
            continue
        name = _call_name(rule, accepted)
        if name is not None:
            kwargs[name] = value
    guidance = generic.get("guidance_scale")
    if (
        guidance is not None
        and guidance > 1
        and _call_name(CALL_ARGUMENTS["guidance_scale"], accepted) == TRUE_CFG
        and "negative_prompt" not in kwargs
    ):
        # True CFG runs only with a negative prompt; the request's guidance is CFG against the
        # empty prompt when it has none (as on SD, and as a batch with a negative prompt beside
        # it would run). Qwen-Image's model card passes " " for the same reason.
        prompt = generic.get("prompt")
        kwargs["negative_prompt"] = [""] * len(prompt) if isinstance(prompt, list) else ""
    return kwargs


def _call_name(rule: CallArgument, accepted: Set[str]) -> str | None:
    """The name `rule`'s value goes under on a pipeline taking `accepted`; None when it takes none."""
    name = next((n for n in rule.names if n in accepted), None)
    if name is None and rule.fallback in accepted:
        return rule.fallback
    return name


def check_call_arguments(plan: ItemPlan, accepted: Set[str]) -> None:
    """Refuse a request value the pipeline has no argument for (a prompt to Stable Video
    Diffusion); JobFailure(INVALID_ARGUMENT) naming the request field."""
    req = plan.item.request
    values = {
        "prompt": req.prompt,
        "negative_prompt": req.negative_prompt,
        "num_images_per_prompt": plan.num_outputs,
        **plan.common,
    }
    for key, value in values.items():
        rule = CALL_ARGUMENTS.get(key)
        if rule is None or not rule.field or value is None or value == rule.neutral:
            continue
        if _call_name(rule, accepted) is None:
            # No echo of the value: a prompt stays out of errors and logs, as out of reports.
            reason = f"this model's pipeline takes no {rule.field}; leave it unset"
            raise JobFailure(INVALID_ARGUMENT, reason, rule.field)
    _check_distilled_negative_prompt(req, accepted)


def _check_distilled_negative_prompt(req: t.GenerateRequest, accepted: Set[str]) -> None:
    """A guidance-distilled model (FLUX.1-dev: guidance is an embedding, one pass per step) takes a
    negative prompt only under true classifier-free guidance, `extra.true_cfg_scale` > 1; without
    it the pipeline would ignore the negative prompt without a word."""
    if not req.negative_prompt.strip() or TRUE_CFG not in accepted:
        return
    if _call_name(CALL_ARGUMENTS["guidance_scale"], accepted) == TRUE_CFG:
        return  # the request's guidance is the true CFG scale already (Qwen-Image)
    scale = req.extra.get(TRUE_CFG)
    if not (isinstance(scale, int | float) and not isinstance(scale, bool) and scale > 1):
        reason = (
            "this model's guidance is distilled (one pass per step): a negative prompt acts only under "
            f"true classifier-free guidance, extra.{TRUE_CFG} > 1 (two passes per step)"
        )
        raise JobFailure(INVALID_ARGUMENT, reason, "negative_prompt")


@dataclass
class ItemPlan:
    """One job's share of a pipeline call."""

    item: AssignmentItem
    num_outputs: int
    seeds: list[int]
    output_format: str
    scheduler: str
    # width, height, num_inference_steps, guidance_scale when set (request, else model default).
    common: dict[str, Any] = field(default_factory=dict)
    # Model-specific extras and media inputs, filled once the pipeline is known.
    specific: dict[str, Any] = field(default_factory=dict)
    task: t.Task = t.Task.TEXT2IMAGE
    # Frames per second of a video output (export only; 0 for images).
    fps: float = 0.0

    @property
    def job_id(self) -> str:
        return self.item.job_id

    def group_key(self) -> str:
        """Plans with equal keys can share one pipeline call (`omnirt._internal.batching`), on the
        values this plan resolved: seeds, prompts and counts may differ; media inputs never batch."""
        if not batching.batchable(self.item.request):
            return "solo:" + self.job_id
        extra = dict(self.specific)  # the pipeline's own arguments, and the request's strength
        fields = {"task": self.task, "fps": self.fps, **self.common, "scheduler": self.scheduler}
        fields["adapters"] = self.item.request.adapters
        return batching.call_key({**fields, "strength": extra.pop("strength", None), "extra": extra})


def scheduler_class(name: str) -> Any:
    """The diffusers scheduler class called `name`; JobFailure(INVALID_ARGUMENT) when there is none."""
    import diffusers

    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
        raise JobFailure(
            INVALID_ARGUMENT, f"unknown scheduler {name!r} (a diffusers scheduler class name)", "scheduler"
        )
    return cls


def plan_item(item: AssignmentItem, spec: t.ModelSpec) -> ItemPlan:
    """Validate one item and fix its seeds; request values first, then the model's defaults.

    The plan's item holds the request with its defaults and seed filled in (`item` is left as is).
    """
    # The controller's rule, again: a no-op on the requests it validated.
    req = dataclasses.replace(item.request, task=defaults.task_of(item.request, spec))
    defaults.apply(req, spec)
    assert req.task is not None and req.num_outputs is not None and req.seed is not None
    task, num_outputs = req.task, req.num_outputs
    if num_outputs < 1:
        raise JobFailure(INVALID_ARGUMENT, "num_outputs must be at least 1", "num_outputs")
    try:
        fmt = task_pipelines.output_format(task, req.output_format)
    except ValueError as exc:
        raise JobFailure(INVALID_ARGUMENT, str(exc), "output.format") from exc
    scheduler = req.scheduler or ""
    if scheduler:
        scheduler_class(scheduler)
    common = {
        "width": req.width,
        "height": req.height,
        "num_inference_steps": req.num_inference_steps,
        "guidance_scale": req.guidance_scale,
    }
    fps = 0.0
    if task_pipelines.is_video(task):
        common["num_frames"] = req.num_frames
        fps = float(req.fps or video_export.DEFAULT_FPS)
    return ItemPlan(
        item=dataclasses.replace(item, request=req),
        num_outputs=num_outputs,
        seeds=defaults.output_seeds(req.seed, num_outputs),
        output_format=fmt,
        scheduler=scheduler,
        common={k: v for k, v in common.items() if v is not None},
        task=task,
        fps=fps,
    )


def call_parameters(pipeline: Any) -> frozenset[str]:
    """Names the pipeline's `__call__` accepts (read once per `__call__` function).

    Less `guidance_scale` where the pipeline ignores it: pipelines with a `true_cfg_scale` (Flux,
    HunyuanVideo, Qwen-Image) embed `guidance_scale` into a guidance-distilled transformer
    (FLUX.1-dev) and drop it, with a warning, when `transformer.config.guidance_embeds` is false
    (Qwen-Image, FLUX.1-schnell); there the request's guidance goes to `true_cfg_scale`.
    """
    call = pipeline.__call__
    function = getattr(call, "__func__", None)
    # Not a plain method: read it each time.
    names = _parameters(function) if function is not None else frozenset(inspect.signature(call).parameters)
    config = getattr(getattr(pipeline, "transformer", None), "config", None)
    if TRUE_CFG in names and getattr(config, "guidance_embeds", None) is False:
        return names - {"guidance_scale"}
    return names


@functools.lru_cache(maxsize=256)
def _parameters(function: Any) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters) - {"self"}


def _plain_number(value: Any) -> Any:
    # google.protobuf.Struct carries every number as a double; integral ones go back to int,
    # also inside lists (token indices, a [height, width] pair).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain_number(v) for v in value]
    return value


def pipeline_kwargs(plan: ItemPlan, accepted: Set[str], inputs: media_inputs.InputPolicy) -> None:
    """Fill `plan.specific` with the request's extras, media inputs and strength the pipeline takes.

    A request value the pipeline has no argument for is refused (`check_call_arguments`).
    `inputs` says which `file://` URIs the worker may read.
    """
    check_call_arguments(plan, accepted)
    req = plan.item.request
    specific: dict[str, Any] = {}
    # A fallback name is a request field's on this pipeline (`true_cfg_scale` on Qwen-Image).
    taken = {_call_name(rule, accepted): rule.field for rule in CALL_ARGUMENTS.values() if rule.fallback}
    for key, value in req.extra.items():
        if key in taken:
            reason = f"{key!r} is the request's {taken[key]} on this model; set that instead"
            raise JobFailure(INVALID_ARGUMENT, reason, f"extra.{key}")
        if key in RESERVED_ARGUMENTS or key not in accepted:
            raise JobFailure(INVALID_ARGUMENT, f"the pipeline does not take {key!r}", f"extra.{key}")
        specific[key] = _plain_number(value)
    for index, media in enumerate(req.inputs):
        argument = MEDIA_ARGUMENTS.get(media.role) if media.role else None
        if argument is None or argument not in accepted:
            role = media.role.value if media.role else "unspecified"
            reason = f"the pipeline does not take a {role} input"
            raise JobFailure(INVALID_ARGUMENT, reason, f"inputs[{index}]")
    width, height = plan.common.get("width"), plan.common.get("height")
    size = (int(width), int(height)) if width and height else None
    specific.update(media_inputs.image_inputs(req.inputs, MEDIA_ARGUMENTS, size, inputs))
    if req.strength is not None:
        if "strength" not in accepted:
            raise JobFailure(INVALID_ARGUMENT, "the pipeline does not take 'strength'", "strength")
        steps = plan.common.get("num_inference_steps")
        if steps and int(steps * req.strength) < 1:  # diffusers would fail on an empty schedule
            reason = f"strength {req.strength} runs 0 of {steps} steps; raise strength or num_inference_steps"
            raise JobFailure(INVALID_ARGUMENT, reason, "strength")
        specific["strength"] = req.strength
    specific.update(audio_arguments(plan, accepted))
    plan.specific = specific


def audio_arguments(plan: ItemPlan, accepted: Set[str]) -> dict[str, Any]:
    """An audio request's duration_ms as the pipeline's clip window (Stable Audio's
    `audio_end_in_s`, from `audio_start_in_s` 0) or length (AudioLDM 2's `audio_length_in_s`);
    none for other tasks or an unset duration (the
    pipeline's longest clip). JobFailure naming duration_ms when the pipeline has no such window.

    Part of `specific`, so jobs of different durations never share a call. Whether the model can
    make that long a clip is `task_pipelines.check_audio`'s to say, from the loaded pipeline."""
    duration = plan.item.request.duration_ms
    if duration is None or not task_pipelines.is_audio(plan.task):
        return {}
    if AUDIO_END not in accepted and AUDIO_LENGTH in accepted:  # AudioLDM 2: a length, from 0
        return {AUDIO_LENGTH: duration / 1000}
    if AUDIO_END not in accepted:
        reason = "this model's pipeline takes no duration_ms; leave it unset"
        raise JobFailure(INVALID_ARGUMENT, reason, "duration_ms")
    window = {AUDIO_END: duration / 1000}
    if AUDIO_START in accepted:
        window[AUDIO_START] = 0.0
    return window


def _echo(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bad_extra(key: str, reason: str, code: str = INVALID_ARGUMENT) -> JobFailure:
    return JobFailure(code, f"extra.{key}: {reason}", f"extra.{key}")


# An annotation that takes a sequence too (`float | list[float]`: one per ControlNet).
_TAKES_SEQUENCE = re.compile(r"\b(?:list|List|tuple|Tuple|Sequence)\b")


@functools.lru_cache(maxsize=256)
def _number_defaults(function: Any) -> dict[str, bool]:
    """The parameters of `function` whose default is a number (not a bool), each with whether its
    annotation takes a list of numbers too (diffusers' ControlNet scales)."""
    parameters = inspect.signature(function).parameters.values()
    return {
        p.name: bool(
            _TAKES_SEQUENCE.search(p.annotation if isinstance(p.annotation, str) else str(p.annotation))
        )
        for p in parameters
        if _is_number(p.default)
    }


def check_arguments(pipeline: Any, plan: ItemPlan) -> None:
    """Refuse, before the call, request extras the pipeline would fail on with a Python error.

    `clip_skip` is checked against the model's text encoders, `guidance_rescale` must be a number
    from 0 to 1, `guidance_scale_2` needs a two-expert model (Wan 2.2), a video longer than a
    diffusion-forcing window needs `overlap_history`, a media input the pipeline requires must be
    there (JobFailure naming `inputs`), an argument whose default is a number
    must get a number (or a list of them, when its annotation takes one), and any other must fit
    its annotation (`extra_types`). JobFailure naming `extra.KEY`. A transformers TTS model
    refuses its own fields first (`speech.check_request`).
    """
    if isinstance(pipeline, speech.SpeechPipeline):
        speech.check_request(pipeline, plan.item.request.prompt, plan.common, plan.specific, plan.scheduler)
    extra = {k: plan.specific[k] for k in plan.item.request.extra if k in plan.specific}
    if "clip_skip" in extra:
        _check_clip_skip(pipeline, extra["clip_skip"])
    rescale = extra.get("guidance_rescale")
    if rescale is not None and not (_is_number(rescale) and 0 <= rescale <= 1):  # NaN fails too
        raise _bad_extra("guidance_rescale", f"a number from 0 to 1 (got {_echo(rescale)})")
    if extra.get("guidance_scale_2") is not None:
        _check_guidance_scale_2(pipeline, extra["guidance_scale_2"])
    call = getattr(pipeline.__call__, "__func__", None)
    if call is not None:
        _check_required_inputs(call, plan)
        _check_long_video(pipeline, call, plan.common.get("num_frames"), extra)
    numbers = _number_defaults(call) if call is not None else {}
    for key, value in extra.items():
        if key not in numbers or _is_number(value):
            continue
        if not numbers[key]:
            raise _bad_extra(key, f"a number (got {_echo(value)})")
        if not (isinstance(value, list) and value and all(_is_number(v) for v in value)):
            raise _bad_extra(key, f"a number or a list of numbers (got {_echo(value)})")
    for key, value in extra.items() if call is not None else ():
        wanted = extra_types.mismatch(call, key, value)
        if wanted is not None:
            raise _bad_extra(key, f"expected {wanted} (got {_echo(value)})")


@functools.lru_cache(maxsize=256)
def _required_parameters(function: Any) -> frozenset[str]:
    parameters = inspect.signature(function).parameters.values()
    return frozenset(p.name for p in parameters if p.default is inspect.Parameter.empty) - {"self"}


def check_task_inputs(task: t.Task, req: t.GenerateRequest) -> None:
    """A job without an input its task needs (image2image: an image, inpaint: an image and a
    mask, ...; the controller's rule, for a job sent without it): INVALID_ARGUMENT naming `inputs`."""
    roles = {media.role for media in req.inputs}
    for role in REQUIRED_INPUTS.get(task, ()):
        if role not in roles:
            reason = f"{task.value} needs an input with role {role.value}"
            raise JobFailure(INVALID_ARGUMENT, reason, "inputs")


def _check_required_inputs(call: Any, plan: ItemPlan) -> None:
    # The controller refuses an image2video or image2image job without its image; a job sent
    # without it anyway would fail in the pipeline's `__call__` (a TypeError, or Qwen-Image-Edit's
    # `image=None` failing on `.size`: an internal error).
    req = plan.item.request
    check_task_inputs(plan.task, req)
    given = {MEDIA_ARGUMENTS.get(media.role) for media in req.inputs if media.role}
    for role, argument in MEDIA_ARGUMENTS.items():
        if argument in _required_parameters(call) and argument not in given:
            reason = f"this model's pipeline needs an input with role {role.value}"
            raise JobFailure(INVALID_ARGUMENT, reason, "inputs")


def _check_guidance_scale_2(pipeline: Any, value: Any) -> None:
    # The low-noise expert's guidance (Wan 2.2): diffusers' Wan pipelines raise a ValueError for
    # it on a model of one transformer, whose config has no `boundary_ratio` (Wan 2.1).
    if not _is_number(value):
        raise _bad_extra("guidance_scale_2", f"a number (got {_echo(value)})")
    config = getattr(pipeline, "config", None)
    if isinstance(config, dict) and "boundary_ratio" in config and config["boundary_ratio"] is None:
        reason = "this model has one transformer (no boundary_ratio, not Wan 2.2's two); leave it unset"
        raise _bad_extra("guidance_scale_2", reason)


@functools.lru_cache(maxsize=256)
def _defaults(function: Any) -> dict[str, Any]:
    return {p.name: p.default for p in inspect.signature(function).parameters.values()}


def _check_long_video(pipeline: Any, call: Any, frames: Any, extra: dict[str, Any]) -> None:
    # SkyReels-V2's diffusion-forcing pipelines make a video longer than `base_num_frames` (97 by
    # default) window after window, overlapping by `overlap_history` frames: without it they
    # raise a ValueError, and with an overlap of a whole window (in latent frames) they divide
    # by zero.
    defaults = _defaults(call)
    if not frames or "overlap_history" not in defaults or "base_num_frames" not in defaults:
        return
    base, overlap = extra.get("base_num_frames", defaults["base_num_frames"]), extra.get("overlap_history")
    if not isinstance(base, int) or frames <= base:
        return
    if overlap is None:
        reason = (
            f"needed for num_frames {frames} > base_num_frames {base}: the model makes a longer video "
            "window by window, each overlapping the last by this many frames (17 or 37 recommended)"
        )
        raise _bad_extra("overlap_history", reason)
    temporal = getattr(pipeline, "vae_scale_factor_temporal", 1)
    most = (base - 1) // temporal * temporal  # the longest overlap that leaves a latent frame new
    if not (isinstance(overlap, int) and not isinstance(overlap, bool) and 1 <= overlap <= most):
        raise _bad_extra("overlap_history", f"a frame count from 1 to {most} (got {_echo(overlap)})")


def _check_clip_skip(pipeline: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad_extra("clip_skip", f"an integer (got {_echo(value)})")
    if value < 0:
        raise _bad_extra("clip_skip", f"at least 0 (got {value})")
    encoders = [getattr(pipeline, n, None) for n in ("text_encoder", "text_encoder_2")]
    depths = [getattr(getattr(e, "config", None), "num_hidden_layers", None) for e in encoders]
    layers = [d for d in depths if isinstance(d, int)]
    # clip_skip layers are skipped from the end; at least one must run.
    if layers and value > min(layers) - 1:
        raise _bad_extra(
            "clip_skip", f"at most {min(layers) - 1} for this model's text encoder (got {value})"
        )
    encoder = encoders[0]
    if (
        encoder is not None
        and not hasattr(encoder, "text_model")
        and not hasattr(encoder, "final_layer_norm")
        and _uses_text_model(type(pipeline).__module__)
    ):
        # diffusers' SD pipelines apply `text_encoder.text_model.final_layer_norm` after the
        # skip; transformers 5 flattened CLIPTextModel (no `text_model`): every clip_skip failed.
        reason = (
            f"{type(pipeline).__name__} cannot skip layers of this text encoder with the worker's "
            "diffusers and transformers versions (it has no text_model)"
        )
        raise _bad_extra("clip_skip", reason, "FAILED_PRECONDITION")


@functools.cache  # two threads at once may both read the file: the same answer, harmless
def _uses_text_model(module: str) -> bool:
    """Whether a pipeline's `module` reaches into `text_encoder.text_model` (read from its file,
    not through inspect's line cache, which is shared and not thread-safe)."""
    path = getattr(sys.modules.get(module), "__file__", None) or ""
    try:
        return "text_encoder.text_model" in Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def resolved_config(plan: ItemPlan, extra: dict[str, Any]) -> dict[str, Any]:
    """The configuration a job really ran with, for `RunReport.config_resolved` (no prompts, no media)."""
    config: dict[str, Any] = dict(plan.common)
    config.update({k: v for k, v in plan.specific.items() if k not in MEDIA_ARGUMENTS.values()})
    config.update(seeds=plan.seeds, num_outputs=plan.num_outputs, output_format=plan.output_format)
    if plan.fps:
        config["fps"] = plan.fps
    config.update(extra)
    return config
