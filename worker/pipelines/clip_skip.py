"""`clip_skip` on diffusers' Stable Diffusion pipelines with transformers 5's `CLIPTextModel`.

diffusers 0.42's SD pipelines (and the pipelines copied from them: ControlNet, PAG, LCM,
AnimateDiff, ...) apply `clip_skip` as: the text encoder's hidden states of layer
`-(clip_skip + 1)`, then `text_encoder.text_model.final_layer_norm`. transformers 5 flattened
`CLIPTextModel` (its `embeddings`, `encoder` and `final_layer_norm` are its own children; no
`text_model`), so every such call failed with an AttributeError. For a call with `clip_skip`,
`text_model_view` gives the call's view of the pipeline its text encoder behind a
`TextModelAlias`: every attribute and call go to the encoder, and `text_model` is the encoder
itself, so the skip applies as diffusers means it.

Only for that call and only on the view: diffusers' LoRA loader reads `hasattr(text_encoder,
"text_model")` to decide whether a checkpoint's `text_model.` key prefix must go, so the
loaded pipeline's encoder must keep looking flattened. Not a shallow copy of the encoder:
transformers 5 installs its hidden-state hooks on the layers once per model object (a flag on
the object), so every copy installed them again on the shared layers and `hidden_states` came
back with each layer several times (the second call's `clip_skip = 1` picked the last layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any


class TextModelAlias:
    """A text encoder with `text_model` naming itself; everything else is the encoder's own."""

    __slots__ = ("_encoder",)

    def __init__(self, encoder: Any) -> None:
        object.__setattr__(self, "_encoder", encoder)

    @property
    def text_model(self) -> Any:
        return self._encoder

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._encoder(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._encoder, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._encoder, name, value)


@contextlib.contextmanager
def text_model_view(view: Any, kwargs: Mapping[str, Any]) -> Iterator[None]:
    """While the call runs, `view.text_encoder` has a `text_model` when the call skips CLIP
    layers (`kwargs["clip_skip"]` set) and the encoder is a flattened CLIP text model."""
    encoder = getattr(view, "text_encoder", None)
    if (
        kwargs.get("clip_skip") is None
        or encoder is None
        or hasattr(encoder, "text_model")
        or not hasattr(encoder, "final_layer_norm")
    ):
        yield
        return
    # Not diffusers' __setattr__: it would write the component into the config the view shares.
    object.__setattr__(view, "text_encoder", TextModelAlias(encoder))
    try:
        yield
    finally:
        object.__setattr__(view, "text_encoder", encoder)
