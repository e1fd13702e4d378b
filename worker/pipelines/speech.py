"""Transformers text-to-speech models served as `text2audio`: VITS / MMS-TTS (`VitsModel`).

A catalog entry with `pipeline_class = "VitsModel"` names a transformers checkpoint (config.json,
model.safetensors, vocab.json, tokenizer_config.json at the folder's root, as
`facebook/mms-tts-eng` has), not a diffusers pipeline. `load` makes it a `SpeechPipeline`, which
the model cache, the runtime options and the legacy_call executor treat like a pipeline: it has
`components` (its bytes, the meta-device check), `to`, `set_progress_bar_config`, a placeholder
`scheduler` (it runs no denoising loop), `sampling_rate` (the artifacts' rate) and a `__call__`
whose signature says what a request may set (`args.call_parameters`): the prompt, the count of
outputs (`num_waveforms_per_prompt`), their generators (the seeds), and the extras `speed`
(OpenAI's speed, VITS's `speaking_rate`, 0.25 to 4), `noise_scale` and `noise_scale_duration`.

Load options (`runtime` of the catalog entry or `extra.runtime` of a request): `dtype` and one
device (`devices`) apply: the model is loaded in that dtype and moved to that device. The others
refuse the load, the message naming the field (FAILED_PRECONDITION, as every load failure):
`device_map` or several devices (one module, one device), `cpu_offload` (no diffusers offload
hooks), `layerwise_casting` and `quantization` (they act on a diffusers denoiser, which VITS has
not) and `torch_compile` (the output length follows the predicted durations: every prompt would
be a new shape to compile). Call options: a step cache is refused by `step_cache.check` (no
denoiser), VAE slicing and tiling are ignored with a warning (no VAE).

Request fields that have no meaning without diffusion are refused before the call
(`check_request`, INVALID_ARGUMENT naming the field): num_inference_steps, width, height,
scheduler; guidance_scale, negative_prompt and duration_ms are refused by the generic argument
checks, as the call takes none of them. A prompt must hold at least one character the
tokenizer reads and at most `MAX_PROMPT_CHARS`.

Seeds: VITS samples noise twice per call, in its stochastic duration predictor (`torch.randn`
on the CPU) and in its prior (`torch.randn_like` on the model's device), both from torch's
global generators, not from a generator argument. Each output runs alone (batch of one, so
padding never changes another prompt's clip) under `torch.random.fork_rng` with
`torch.manual_seed(seed)`: the same seed gives the same samples, the caller's RNG state is left
as it was. The global generators are process-wide, so those calls hold `_RNG_LOCK`: VITS calls
of this process run one at a time (tiny-vits: a 2 s clip's forward pass takes 60 ms on one
CPU thread).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnirt._internal.limits import ECHO_CHARS
from omnirt.worker.failures import JobFailure
from omnirt.worker.runtime.backends import Placement

if TYPE_CHECKING:
    from omnirt.worker.runtime.options import LoadOptions

# Catalog `pipeline_class` names served by this module (transformers classes).
MODEL_CLASSES = frozenset({"VitsModel"})
# Characters of a prompt: OpenAI's speech endpoint takes 4096; VITS has no window of its own
# (relative attention), its time and memory grow with the text, so this is the cap here too.
MAX_PROMPT_CHARS = 4096
# OpenAI's `speed` range; VITS's `speaking_rate` divides every predicted duration by it.
MIN_SPEED, MAX_SPEED = 0.25, 4.0
# Past this the prior's noise drowns the text's means (VITS's own default is 0.667).
MAX_NOISE_SCALE = 10.0
NOISE_EXTRAS = ("noise_scale", "noise_scale_duration")
# Request fields of a diffusion pipeline that a TTS call has no use for.
DIFFUSION_FIELDS = ("num_inference_steps", "width", "height")
INVALID_ARGUMENT = "INVALID_ARGUMENT"

# torch's global generators are process-wide: seeded calls must not interleave.
_RNG_LOCK = threading.Lock()


class NoScheduler:
    """The `scheduler` of a model that runs no denoising loop (what legacy_call copies per call)."""

    config: Mapping[str, Any] = {}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> NoScheduler:
        return cls()


@dataclass
class SpeechOutput:
    """A call's clips, one (1, samples) float tensor per output, as `tasks.call_outputs` reads."""

    audios: list[Any]


def is_speech_class(name: str) -> bool:
    """Whether catalog `pipeline_class` `name` is a transformers TTS model served here."""
    return name in MODEL_CLASSES


def refused_options(options: LoadOptions, placement: Placement) -> list[str]:
    """Why each load option set cannot apply to a transformers TTS model ("runtime.NAME: reason")."""
    reasons = []
    if placement.device_map or len(placement.devices) > 1:
        reasons.append("runtime.device_map: a VITS model is one module and runs on one device")
    if options.cpu_offload:
        reasons.append("runtime.cpu_offload: a transformers TTS model has no diffusers offload hooks")
    for name in ("layerwise_casting", "quantization"):
        if getattr(options, name):
            reasons.append(f"runtime.{name}: acts on a diffusers denoiser, which a VITS model has not")
    if options.torch_compile:
        reasons.append(
            "runtime.torch_compile: VITS's output length follows its predicted durations, "
            "a new shape for every prompt"
        )
    return reasons


def load(location: str, pipeline_class: str, placement: Placement, options: LoadOptions) -> SpeechPipeline:
    """The model at `location` (a folder or hub id) in `placement`'s dtype, on its device.

    ValueError (the model cache's ModelLoadError) for a load option it refuses, before any weight
    is read, or a model whose weights came out on the meta device."""
    refused = refused_options(options, placement)
    if refused:
        raise ValueError("; ".join(refused))
    import transformers

    cls = getattr(transformers, pipeline_class)
    model = cls.from_pretrained(location, dtype=placement.torch_dtype())
    tokenizer = transformers.AutoTokenizer.from_pretrained(location)
    if getattr(tokenizer, "phonemize", False) and importlib.util.find_spec("phonemizer") is None:
        # VITS checkpoints trained on phonemes (kakao-enterprise/vits-ljs); MMS-TTS reads characters.
        raise ValueError("its tokenizer phonemizes text, which needs the phonemizer package (and espeak)")
    if any(p.device.type == "meta" for p in (*model.parameters(), *model.buffers())):
        raise ValueError("the model's weights came out on the meta device")
    model.eval()
    return wrapper_class(pipeline_class)(model, tokenizer).to(placement.device)


@functools.cache
def wrapper_class(model_class: str) -> type[SpeechPipeline]:
    """A `SpeechPipeline` subclass named after the model's class: reports (`pipeline_class`) say
    `VitsModel`, as the catalog entry does."""
    doc = f"A transformers {model_class} called like a diffusers audio pipeline."
    return type(model_class, (SpeechPipeline,), {"__module__": __name__, "__doc__": doc})


class SpeechPipeline:
    """A transformers TTS model and its tokenizer, called like a diffusers audio pipeline."""

    max_prompt_chars = MAX_PROMPT_CHARS

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.scheduler = NoScheduler()
        self._omnirt_options: dict[str, Any] = {}
        self._omnirt_notes: list[str] = []

    @property
    def components(self) -> dict[str, Any]:
        return {"model": self.model}

    @property
    def sampling_rate(self) -> int:
        return int(self.model.config.sampling_rate)

    def to(self, device: str) -> SpeechPipeline:
        self.model.to(device)
        return self

    def set_progress_bar_config(self, **_: Any) -> None:
        """No progress bar: the model runs one forward pass per output."""

    def text_ids(self, text: str) -> list[int]:
        """The token ids of the characters of `text` the tokenizer reads (none: it reads nothing)."""
        prepared, _ = self.tokenizer.prepare_for_tokenization(text)
        if not prepared.strip():  # all dropped by its normalization, or only spaces
            return []
        ids = self.tokenizer(text).input_ids
        unknown = self.tokenizer.unk_token_id
        return ids if any(i != unknown for i in ids) else []

    def __call__(
        self,
        prompt: str | list[str],
        num_waveforms_per_prompt: int = 1,
        generator: Any = None,
        speed: float | None = None,
        noise_scale: float | None = None,
        noise_scale_duration: float | None = None,
    ) -> SpeechOutput:
        """One clip per prompt and output, each from its own generator's seed (module docstring);
        `speed` None keeps the checkpoint's own `speaking_rate` (1 for MMS-TTS)."""
        import torch

        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        texts = [text for text in prompts for _ in range(num_waveforms_per_prompt)]
        generators = generator if isinstance(generator, list) else [generator] * len(texts)
        if len(generators) != len(texts):
            raise ValueError(f"{len(generators)} generators for {len(texts)} outputs")
        device = next(self.model.parameters()).device
        audios = []
        for text, gen in zip(texts, generators, strict=True):
            ids = torch.tensor([self.text_ids(text)], dtype=torch.long, device=device)
            seed = gen.initial_seed() if gen is not None else None
            noise = self._noise(noise_scale, noise_scale_duration)
            with _RNG_LOCK, _seeded(seed, device), noise, torch.inference_mode():
                out = self.model(input_ids=ids, speaking_rate=None if speed is None else float(speed))
            audios.append(out.waveform[:, : int(out.sequence_lengths[0])])
        return SpeechOutput(audios)

    @contextlib.contextmanager
    def _noise(self, noise_scale: float | None, noise_scale_duration: float | None) -> Iterator[None]:
        # VitsModel reads both from attributes, not arguments: set for the call, under _RNG_LOCK.
        saved = (self.model.noise_scale, self.model.noise_scale_duration)
        if noise_scale is not None:
            self.model.noise_scale = float(noise_scale)
        if noise_scale_duration is not None:
            self.model.noise_scale_duration = float(noise_scale_duration)
        try:
            yield
        finally:
            self.model.noise_scale, self.model.noise_scale_duration = saved


@contextlib.contextmanager
def _seeded(seed: int | None, device: Any) -> Iterator[None]:
    """torch's CPU generator and `device`'s seeded with `seed` for the block, restored after."""
    import torch

    if seed is None:
        yield
        return
    devices: Sequence[int] = []
    if device.type != "cpu":
        index = device.index if device.index is not None else getattr(torch, device.type).current_device()
        devices = [index]
    with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
        torch.manual_seed(seed)
        yield


def _bad(field: str, reason: str) -> JobFailure:
    return JobFailure(INVALID_ARGUMENT, f"{field}: {reason}", field)


def _echo(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 3] + "..."


def check_request(
    pipeline: SpeechPipeline,
    prompt: str,
    common: Mapping[str, Any],
    specific: Mapping[str, Any],
    scheduler: str,
) -> None:
    """Refuse, before the call, what a TTS model cannot do (JobFailure naming the field): a job's
    prompt, its common arguments, its model-specific ones and its scheduler, as planned."""
    for name in DIFFUSION_FIELDS:
        if common.get(name) is not None:
            raise _bad(name, "this text-to-speech model runs no diffusion; leave it unset")
    if scheduler:
        raise _bad("scheduler", "this text-to-speech model runs no denoising loop; leave it unset")
    if len(prompt) > pipeline.max_prompt_chars:
        reason = f"at most {pipeline.max_prompt_chars} characters for this model (got {len(prompt)})"
        raise _bad("prompt", reason)
    if not pipeline.text_ids(prompt):
        raise _bad("prompt", "holds no character this model's tokenizer reads (letters, for MMS-TTS)")
    speed = specific.get("speed")
    if speed is not None and not (_number(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise _bad("extra.speed", f"a number from {MIN_SPEED:g} to {MAX_SPEED:g} (got {_echo(speed)})")
    for name in NOISE_EXTRAS:
        value = specific.get(name)
        if value is not None and not (_number(value) and 0 <= value <= MAX_NOISE_SCALE):
            raise _bad(f"extra.{name}", f"a number from 0 to {MAX_NOISE_SCALE:g} (got {_echo(value)})")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
