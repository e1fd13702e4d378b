"""The original OmniRT's request builders, for its users' code as it is.

    import omnirt
    from omnirt.requests import text2image

    result = omnirt.generate(text2image(model="sdxl-base-1.0", prompt="a lighthouse", preset="fast"))
    print(result.outputs[0].path)

Each builder takes the original's keywords (`model`, the task's inputs, `backend`, `adapters`,
and any `**config`: `preset`, `width`, `seed`, ...) and returns an `OriginalRequest` in the
original's shape (`task`, `model`, `backend`, `inputs`, `config`, `adapters`);
`omnirt.generate` / `omnirt.validate` take it, as they take the same request as a dict or a
YAML or JSON file. What each key becomes here is `omnirt._internal.original` (docs/migrating.md).

This module loads neither gRPC nor PyYAML until a YAML file is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "AdapterRef",
    "AudioToTextRequest",
    "AudioToVideoRequest",
    "EditRequest",
    "ImageToImageRequest",
    "ImageToVideoRequest",
    "InpaintRequest",
    "OriginalRequest",
    "TextToAudioRequest",
    "TextToImageRequest",
    "TextToVideoRequest",
    "audio2text",
    "audio2video",
    "edit",
    "image2image",
    "image2video",
    "inpaint",
    "load_request_file",
    "text2audio",
    "text2image",
    "text2video",
]

YAML_MISSING = "reading a YAML request needs PyYAML: pip install 'omnirt[yaml]' (or give the request as JSON)"


@dataclass
class AdapterRef:
    """A LoRA adapter as the original names one; here `path` is a catalog adapter's name."""

    kind: str
    path: str
    scale: float = 1.0


@dataclass
class OriginalRequest:
    """A request in the original's shape (its `GenerateRequest`)."""

    task: str
    model: str
    backend: str = "auto"
    inputs: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    adapters: list[AdapterRef] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The request as the original's JSON object."""
        adapters = None if self.adapters is None else [_adapter_dict(a) for a in self.adapters]
        return {
            "task": self.task,
            "model": self.model,
            "backend": self.backend,
            "inputs": dict(self.inputs),
            "config": dict(self.config),
            "adapters": adapters,
        }

    @classmethod
    def from_dict(cls, payload: Mapping[str, Any]) -> OriginalRequest:
        """The request a dict describes, read loosely (the translation checks every key)."""
        adapters = payload.get("adapters")
        return cls(
            task=str(payload.get("task") or ""),
            model=str(payload.get("model") or ""),
            backend=str(payload.get("backend") or "auto"),
            inputs=dict(payload.get("inputs") or {}),
            config=dict(payload.get("config") or {}),
            adapters=[_adapter_ref(a) for a in adapters] if isinstance(adapters, list) else None,
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> OriginalRequest:
        """The request of a YAML or JSON file (`.json` is JSON, any other name YAML)."""
        return cls.from_dict(load_request_file(path))


def load_request_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The object of a request file: JSON when it ends in `.json`, else YAML, as the original reads.

    OSError when it cannot be read; ValueError when it is not one object of valid JSON or YAML;
    ModuleNotFoundError naming `omnirt[yaml]` for YAML without PyYAML.
    """
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    if file.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{file}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ModuleNotFoundError(YAML_MISSING, name="yaml") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{file}: not valid YAML ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: a request file holds one object (task, model, inputs, config)")
    return data


def _adapter_ref(item: Any) -> AdapterRef:
    if isinstance(item, AdapterRef):
        return item
    if isinstance(item, Mapping):
        return AdapterRef(
            kind=str(item.get("kind", "lora")),
            path=str(item.get("path", "")),
            scale=float(item.get("scale", 1.0)),
        )
    raise TypeError(f"an adapter is an AdapterRef or a {{kind, path, scale}} dict, not {type(item).__name__}")


def _adapter_dict(item: AdapterRef | Mapping[str, Any]) -> dict[str, Any]:
    return asdict(item) if isinstance(item, AdapterRef) else dict(item)


def _inputs(**values: Any) -> dict[str, Any]:
    """The inputs that were given (the original leaves out empty prompts and unset counts)."""
    return {key: value for key, value in values.items() if value is not None and value != ""}


def _adapters(adapters: Sequence[AdapterRef | Mapping[str, Any]] | None) -> list[AdapterRef] | None:
    return None if adapters is None else [_adapter_ref(a) for a in adapters]


# ---- the original's typed requests -----------------------------------------------------------


class TextToImageRequest(OriginalRequest):
    """text2image: `prompt` (and `negative_prompt`)."""

    def __init__(
        self,
        *,
        model: str,
        prompt: str,
        negative_prompt: str | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {"prompt": prompt, **_inputs(negative_prompt=negative_prompt)}
        super().__init__("text2image", model, backend, inputs, dict(config or {}), _adapters(adapters))


class TextToVideoRequest(OriginalRequest):
    """text2video: `prompt`, `negative_prompt`, `num_frames`, `fps`."""

    def __init__(
        self,
        *,
        model: str,
        prompt: str,
        negative_prompt: str | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {
            "prompt": prompt,
            **_inputs(negative_prompt=negative_prompt, num_frames=num_frames, fps=fps),
        }
        super().__init__("text2video", model, backend, inputs, dict(config or {}), _adapters(adapters))


class TextToAudioRequest(OriginalRequest):
    """text2audio: `prompt`, a reference `audio` and its `reference_text`."""

    def __init__(
        self,
        *,
        model: str,
        prompt: str,
        audio: str,
        reference_text: str | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {"prompt": prompt, "audio": audio, **_inputs(reference_text=reference_text)}
        super().__init__("text2audio", model, backend, inputs, dict(config or {}), _adapters(adapters))


class AudioToTextRequest(OriginalRequest):
    """audio2text: `audio`."""

    def __init__(
        self,
        *,
        model: str,
        audio: str,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        super().__init__(
            "audio2text", model, backend, {"audio": audio}, dict(config or {}), _adapters(adapters)
        )


class ImageToImageRequest(OriginalRequest):
    """image2image: `image`, `prompt` (and `negative_prompt`)."""

    def __init__(
        self,
        *,
        model: str,
        image: str,
        prompt: str,
        negative_prompt: str | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {"image": image, "prompt": prompt, **_inputs(negative_prompt=negative_prompt)}
        super().__init__("image2image", model, backend, inputs, dict(config or {}), _adapters(adapters))


class InpaintRequest(OriginalRequest):
    """inpaint: `image`, `mask` (white is repainted), `prompt`."""

    def __init__(
        self,
        *,
        model: str,
        image: str,
        mask: str,
        prompt: str,
        negative_prompt: str | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {"image": image, "mask": mask, "prompt": prompt, **_inputs(negative_prompt=negative_prompt)}
        super().__init__("inpaint", model, backend, inputs, dict(config or {}), _adapters(adapters))


class EditRequest(OriginalRequest):
    """edit: `image` (one path, or several for multi-image edit models) and `prompt`."""

    def __init__(
        self,
        *,
        model: str,
        image: str | Sequence[str],
        prompt: str,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        images: str | list[str] = image if isinstance(image, str) else list(image)
        super().__init__(
            "edit",
            model,
            backend,
            {"image": images, "prompt": prompt},
            dict(config or {}),
            _adapters(adapters),
        )


class ImageToVideoRequest(OriginalRequest):
    """image2video: `image`, an optional `prompt`, `negative_prompt`, `num_frames`, `fps`."""

    def __init__(
        self,
        *,
        model: str,
        image: str,
        prompt: str | None = None,
        negative_prompt: str | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        optional = _inputs(prompt=prompt, negative_prompt=negative_prompt, num_frames=num_frames, fps=fps)
        super().__init__(
            "image2video",
            model,
            backend,
            {"image": image, **optional},
            dict(config or {}),
            _adapters(adapters),
        )


class AudioToVideoRequest(OriginalRequest):
    """audio2video: a portrait `image`, the driving `audio`, an optional `prompt`."""

    def __init__(
        self,
        *,
        model: str,
        image: str,
        audio: str,
        prompt: str | None = None,
        backend: str = "auto",
        config: Mapping[str, Any] | None = None,
        adapters: Sequence[AdapterRef | Mapping[str, Any]] | None = None,
    ) -> None:
        inputs = {"image": image, "audio": audio, **_inputs(prompt=prompt)}
        super().__init__("audio2video", model, backend, inputs, dict(config or {}), _adapters(adapters))


# ---- the builders (the original's `omnirt.requests`): **config becomes `config` --------------

Adapters = Sequence[AdapterRef | Mapping[str, Any]] | None


def text2image(
    *,
    model: str,
    prompt: str,
    negative_prompt: str | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> TextToImageRequest:
    """A text2image request; `**config` are its settings (`preset`, `width`, `seed`, ...)."""
    return TextToImageRequest(
        model=model,
        prompt=prompt,
        negative_prompt=negative_prompt,
        backend=backend,
        config=config,
        adapters=adapters,
    )


def text2video(
    *,
    model: str,
    prompt: str,
    negative_prompt: str | None = None,
    num_frames: int | None = None,
    fps: int | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> TextToVideoRequest:
    """A text2video request."""
    return TextToVideoRequest(
        model=model, prompt=prompt, negative_prompt=negative_prompt, num_frames=num_frames, fps=fps,
        backend=backend, config=config, adapters=adapters,
    )  # fmt: skip


def text2audio(
    *,
    model: str,
    prompt: str,
    audio: str,
    reference_text: str | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> TextToAudioRequest:
    """A text2audio request."""
    return TextToAudioRequest(
        model=model, prompt=prompt, audio=audio, reference_text=reference_text, backend=backend,
        config=config, adapters=adapters,
    )  # fmt: skip


def audio2text(
    *, model: str, audio: str, backend: str = "auto", adapters: Adapters = None, **config: Any
) -> AudioToTextRequest:
    """An audio2text request (OmniRT serves no speech recognition: validate says so)."""
    return AudioToTextRequest(model=model, audio=audio, backend=backend, config=config, adapters=adapters)


def image2image(
    *,
    model: str,
    image: str,
    prompt: str,
    negative_prompt: str | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> ImageToImageRequest:
    """An image2image request (`image`: a local path or a URL)."""
    return ImageToImageRequest(
        model=model, image=image, prompt=prompt, negative_prompt=negative_prompt, backend=backend,
        config=config, adapters=adapters,
    )  # fmt: skip


def inpaint(
    *,
    model: str,
    image: str,
    mask: str,
    prompt: str,
    negative_prompt: str | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> InpaintRequest:
    """An inpaint request."""
    return InpaintRequest(
        model=model, image=image, mask=mask, prompt=prompt, negative_prompt=negative_prompt,
        backend=backend, config=config, adapters=adapters,
    )  # fmt: skip


def edit(
    *,
    model: str,
    image: str | Sequence[str],
    prompt: str,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> EditRequest:
    """An edit request (an image2image of an edit model here)."""
    return EditRequest(
        model=model, image=image, prompt=prompt, backend=backend, config=config, adapters=adapters
    )


def image2video(
    *,
    model: str,
    image: str,
    prompt: str | None = None,
    negative_prompt: str | None = None,
    num_frames: int | None = None,
    fps: int | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> ImageToVideoRequest:
    """An image2video request."""
    return ImageToVideoRequest(
        model=model, image=image, prompt=prompt, negative_prompt=negative_prompt, num_frames=num_frames,
        fps=fps, backend=backend, config=config, adapters=adapters,
    )  # fmt: skip


def audio2video(
    *,
    model: str,
    image: str,
    audio: str,
    prompt: str | None = None,
    backend: str = "auto",
    adapters: Adapters = None,
    **config: Any,
) -> AudioToVideoRequest:
    """An audio2video request (a talking head)."""
    return AudioToVideoRequest(
        model=model,
        image=image,
        audio=audio,
        prompt=prompt,
        backend=backend,
        config=config,
        adapters=adapters,
    )
