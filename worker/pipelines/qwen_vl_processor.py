"""A Qwen2-VL processor for images only, for workers whose torch has no torchvision.

Qwen-Image-Edit (and Edit Plus, Edit Inpaint, Layered) and Kandinsky 5 ship a transformers
`Qwen2VLProcessor` as a pipeline component. transformers 5 builds that processor only with its
video processor, and `Qwen2VLVideoProcessor` requires torchvision: without it the whole pipeline
fails to load, though the pipelines never pass a video. OmniRT's worker does not install
torchvision (PyPI's build does not import beside the pinned CPU torch), so `processor_kwargs`
gives `from_pretrained` an `ImageQwen2VLProcessor` for each such component instead: the same
processor minus its video processor, with the PIL image processor. With torchvision installed
the checkpoint's own processor loads unchanged.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
from typing import Any

from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

PROCESSOR_CLASS = "Qwen2VLProcessor"


class ImageQwen2VLProcessor(Qwen2VLProcessor):
    """`Qwen2VLProcessor` for text and images, without a video processor (so without torchvision).

    ProcessorMixin takes a processor's parts from its `__init__` parameters (`get_attributes`),
    so this `__init__` names only the image processor and the tokenizer; text with images comes
    out as `Qwen2VLProcessor` makes it (image pads expanded, `pixel_values`, `image_grid_thw`).
    """

    def __init__(
        self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any
    ) -> None:
        # Qwen2VLProcessor's own token set-up; its `__init__` would hand ProcessorMixin a video
        # processor too.
        self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
        self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
        self.image_token_id = getattr(tokenizer, "image_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.image_token
        )
        self.video_token_id = getattr(tokenizer, "video_token_id", None) or tokenizer.convert_tokens_to_ids(
            self.video_token
        )
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike[Any],
        cache_dir: str | os.PathLike[Any] | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        token: str | bool | None = None,
        revision: str = "main",
        **kwargs: Any,
    ) -> ImageQwen2VLProcessor:
        """Load a saved `Qwen2VLProcessor` folder (local or hub, `subfolder` too) without its video
        processor: the PIL image processor from `preprocessor_config.json`, the tokenizer, and the
        processor's own settings (chat template). The hub arguments (`ProcessorMixin`'s own, with its
        defaults) go to each of the three loads."""
        kwargs.update(
            cache_dir=cache_dir,
            force_download=force_download,
            local_files_only=local_files_only,
            token=token,
            revision=revision,
        )
        image_processor = Qwen2VLImageProcessorPil.from_pretrained(pretrained_model_name_or_path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(pretrained_model_name_or_path, **kwargs)
        processor_dict, instantiation_kwargs = cls.get_processor_dict(pretrained_model_name_or_path, **kwargs)
        processor = cls.from_args_and_dict(
            [image_processor, tokenizer], processor_dict, **instantiation_kwargs
        )
        assert isinstance(processor, ImageQwen2VLProcessor)
        return processor


def torchvision_available() -> bool:
    """Whether transformers can build the video processor (and so the standard processor)."""
    return importlib.util.find_spec("torchvision") is not None


def _declared_components(pipeline_class: type) -> list[str]:
    """The `__init__` components the pipeline class declares as a `Qwen2VLProcessor`."""
    names = []
    for name, parameter in inspect.signature(pipeline_class).parameters.items():
        annotation = parameter.annotation
        if annotation is Qwen2VLProcessor or annotation == PROCESSOR_CLASS:
            names.append(name)
    return names


def _saved_components(folder: str) -> dict[str, str] | None:
    """component -> saved class name, from a local folder's `model_index.json`; None if it has none."""
    try:
        with open(os.path.join(folder, "model_index.json")) as handle:
            index = json.load(handle)
    except (OSError, ValueError):
        return None
    return {
        name: value[1]
        for name, value in index.items()
        if isinstance(value, list) and len(value) == 2 and isinstance(value[1], str)
    }


def processor_kwargs(pipeline_class: type, location: str) -> dict[str, Any]:
    """`from_pretrained` arguments that load each `Qwen2VLProcessor` component of the pipeline at
    `location` as an `ImageQwen2VLProcessor`; none when torchvision is there or there is no such
    component. A local folder's `model_index.json` says which components are saved as one (a
    pipeline may keep a plain tokenizer where diffusers declares the processor); for a hub id the
    pipeline class's declarations do."""
    if torchvision_available():
        return {}
    saved = _saved_components(location) if os.path.isdir(location) else None
    if saved is not None:
        names = [name for name, class_name in saved.items() if class_name == PROCESSOR_CLASS]
    else:
        names = _declared_components(pipeline_class)
    if not names:
        return {}
    if os.path.isdir(location):
        return {name: ImageQwen2VLProcessor.from_pretrained(os.path.join(location, name)) for name in names}
    return {name: ImageQwen2VLProcessor.from_pretrained(location, subfolder=name) for name in names}
