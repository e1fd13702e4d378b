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
WEIGHT_NAME = "pytorch_lora_weights.safetensors"


def build_tiny_lora(
    pipeline: Any, target: str | Path, *, seed: int = 0, rank: int = 4, std: float = 0.5
) -> Path:
    """Save a LoRA for `pipeline`'s UNet into folder `target`; return the folder.

    The pipeline itself is left unchanged (the adapter is removed again after saving).
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
    with torch.no_grad():
        for param_name, param in unet.named_parameters():
            if "lora_" in param_name and f".{name}." in param_name + ".":
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    state = convert_state_dict_to_diffusers(get_peft_model_state_dict(unet, adapter_name=name))
    type(pipeline).save_lora_weights(
        target, unet_lora_layers=state, weight_name=WEIGHT_NAME, safe_serialization=True
    )
    unet.delete_adapters(name)
    return target
