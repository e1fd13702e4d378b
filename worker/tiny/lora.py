"""A tiny random-weight LoRA for `tiny-sd`, built offline (for demos and tests).

The adapter targets the UNet's attention projections (`to_q`, `to_k`, `to_v`, `to_out.0`)
with seeded random A and B matrices (peft initializes B to zero, which would be a no-op), and
is saved with the pipeline's own `save_lora_weights`, so it loads back through the same
`load_lora_weights` path as any LoRA from the hub.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# The CLIP text encoder's attention projections (for a LoRA that also changes prompt embeddings).
TEXT_ENCODER_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]
WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def build_tiny_lora(
    pipeline: Any,
    target: str | Path,
    *,
    seed: int = 0,
    rank: int = 4,
    std: float = 0.5,
    text_encoder: bool = False,
) -> Path:
    """Save a LoRA for `pipeline`'s UNet (and its text encoder if asked) into folder `target`.

    Returns the folder. The pipeline itself is left unchanged (the adapter is removed again
    after saving; the text encoder's is made on a copy).
    """
    import torch
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, get_peft_model_state_dict

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    unet = pipeline.unet
    name = f"tiny_lora_{seed}"
    unet.add_adapter(
        LoraConfig(r=rank, lora_alpha=rank, target_modules=LORA_TARGETS, init_lora_weights=True), name
    )
    generator = torch.Generator("cpu").manual_seed(seed)
    _randomize(unet, name, generator, std)
    layers = {
        "unet_lora_layers": convert_state_dict_to_diffusers(
            get_peft_model_state_dict(unet, adapter_name=name)
        )
    }
    unet.delete_adapters(name)
    if text_encoder:
        layers["text_encoder_lora_layers"] = _text_encoder_layers(pipeline, name, rank, generator, std)
    type(pipeline).save_lora_weights(target, weight_name=WEIGHT_NAME, safe_serialization=True, **layers)
    return target


def _randomize(model: Any, name: str, generator: Any, std: float) -> None:
    import torch

    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "lora_" in param_name and f".{name}." in param_name + ".":
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def _text_encoder_layers(pipeline: Any, name: str, rank: int, generator: Any, std: float) -> dict[str, Any]:
    import copy

    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model

    # peft directly: transformers' own add_adapter may ask for a newer peft than diffusers does.
    encoder = copy.deepcopy(pipeline.text_encoder)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=TEXT_ENCODER_TARGETS, init_lora_weights=True)
    inject_adapter_in_model(config, encoder, adapter_name=name)
    _randomize(encoder, name, generator, std)
    state: dict[str, Any] = convert_state_dict_to_diffusers(
        get_peft_model_state_dict(encoder, adapter_name=name)
    )
    return state
