"""Random-weight pipelines of published sizes for `bench.gpu`, built offline from bench/gpu_configs.json.

`sd15`: Stable Diffusion 1.5 (UNet 860M, VAE 84M, CLIP ViT-L/14 text encoder 123M parameters).
`sdxl`: Stable Diffusion XL base 1.0 (UNet 2.6B, VAE 84M, CLIP ViT-L/14 123M and OpenCLIP
ViT-bigG/14 695M text encoders), all at their published configs.
`flux`: FLUX.1-dev (the 11.9B `FluxTransformer2DModel`: 19 double- and 38 single-stream blocks,
3072 wide, guidance embedding; its 16-channel VAE and CLIP-L text encoder; T5-XXL cut to 2 of
its 24 layers, see the JSON's `text_encoder_note`).
`wan`: Wan 2.1 text-to-video 1.3B (the transformer and the VAE at their published configs; the
UMT5 text encoder cut to 2 layers, see the JSON's `text_encoder_note`).

Tokenizers are the offline ones of OmniRT's tiny models (no hub). Modules are created directly
on the target device (random init of a billion parameters on a CPU takes minutes), cast to the
benchmark's dtype and saved with `save_pretrained`, so the worker loads them with
`from_pretrained` like any local model.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).with_name("gpu_configs.json")
MODELS = ("sd15", "sdxl", "flux", "wan")
MODULES = ("unet", "transformer", "vae", "text_encoder", "text_encoder_2")


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_configs(smoke: bool = False) -> dict[str, dict[str, Any]]:
    """The configs of each model; with `smoke`, shrunk by the JSON's `smoke` overrides."""
    raw = json.loads(CONFIGS.read_text())
    out = {}
    for name in MODELS:
        spec = {k: v for k, v in raw[name].items() if k != "smoke"}
        out[name] = _merge(spec, raw[name]["smoke"]) if smoke else spec
    return out


def _scheduler(config: dict[str, Any]) -> Any:
    import diffusers

    settings = dict(config)
    cls = getattr(diffusers, settings.pop("class"))
    # from_config, as from_pretrained does: published configs carry keys some classes no longer take.
    return cls.from_config(settings)


def _clip_tokenizer() -> Any:
    from omnirt.worker.tiny import parts

    return parts.clip_tokenizer(max_length=77)


def _clip_config(config: dict[str, Any], tokenizer: Any) -> Any:
    from transformers import CLIPTextConfig

    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    return CLIPTextConfig(**config, **special)


def _t5_tokenizer() -> Any:
    from omnirt.worker.tiny.tokenizers import t5_tokenizer

    return t5_tokenizer()


def _t5_config(config: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    # The offline tokenizer's vocabulary: the real one is not shipped (no hub) and only the
    # embedding table's height depends on it.
    return {
        "vocab_size": len(tokenizer),
        **config,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.pad_token_id,
    }


def _build_sd15(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel

    tokenizer = _clip_tokenizer()
    with torch.device(device):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**spec["unet"])
        vae = AutoencoderKL(**spec["vae"])
        text_encoder = CLIPTextModel(_clip_config(spec["text_encoder"], tokenizer))
    return StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=_scheduler(spec["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )


def _build_sdxl(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKL, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTextModelWithProjection

    # SDXL's two tokenizers are both CLIP BPE tokenizers (the second pads with "!"): the
    # offline one serves both.
    tokenizer = _clip_tokenizer()
    with torch.device(device):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**spec["unet"])
        vae = AutoencoderKL(**spec["vae"])
        text_encoder = CLIPTextModel(_clip_config(spec["text_encoder"], tokenizer))
        text_encoder_2 = CLIPTextModelWithProjection(_clip_config(spec["text_encoder_2"], tokenizer))
    return StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=tokenizer,
        tokenizer_2=tokenizer,
        unet=unet,
        scheduler=_scheduler(spec["scheduler"]),
        force_zeros_for_empty_prompt=spec["force_zeros_for_empty_prompt"],
    )


def _build_flux(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5Config, T5EncoderModel

    tokenizer = _clip_tokenizer()
    tokenizer_2 = _t5_tokenizer()
    transformer_config = dict(spec["transformer"])
    transformer_config["axes_dims_rope"] = tuple(transformer_config["axes_dims_rope"])
    with torch.device(device):
        torch.manual_seed(0)
        text_encoder = CLIPTextModel(_clip_config(spec["text_encoder"], tokenizer))
        text_encoder_2 = T5EncoderModel(T5Config(**_t5_config(spec["text_encoder_2"], tokenizer_2)))
        vae = AutoencoderKL(**spec["vae"])
        transformer = FluxTransformer2DModel(**transformer_config)
    return FluxPipeline(
        scheduler=_scheduler(spec["scheduler"]),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )


def _build_wan(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = _t5_tokenizer()
    transformer_config = dict(spec["transformer"])
    transformer_config["patch_size"] = tuple(transformer_config["patch_size"])
    with torch.device(device):
        torch.manual_seed(0)
        text_encoder = UMT5EncoderModel(UMT5Config(**_t5_config(spec["text_encoder"], tokenizer)))
        vae = AutoencoderKLWan(**spec["vae"])
        transformer = WanTransformer3DModel(**transformer_config)
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=_scheduler(spec["scheduler"]),
    )


BUILDERS: dict[str, Callable[[dict[str, Any], str], Any]] = {
    "sd15": _build_sd15,
    "sdxl": _build_sdxl,
    "flux": _build_flux,
    "wan": _build_wan,
}


def build(name: str, spec: dict[str, Any], target: Path, device: str) -> dict[str, Any]:
    """Build model `name` into `target` (random weights, `spec["dtype"]`); parameter counts per module."""
    import torch

    # Built in float32 and then cast (FLUX.1-dev's transformer: 48 GB for a moment, before
    # the worker starts): diffusers' and transformers' initialisers are written for float32.
    pipeline = BUILDERS[name](spec, device)
    pipeline.to(dtype=getattr(torch, spec["dtype"]))
    params = {
        module: sum(p.numel() for p in getattr(pipeline, module).parameters())
        for module in MODULES
        if getattr(pipeline, module, None) is not None
    }
    pipeline.save_pretrained(str(target))
    del pipeline
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return params


def weight_bytes(path: Path) -> int:
    """The bytes of a saved model's weight files (what the worker's model cache counts it by)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.suffix in (".safetensors", ".bin"))


def load(spec: dict[str, Any], path: Path, device: str) -> Any:
    """The saved pipeline loaded as the worker loads it: `from_pretrained(path, dtype=...)`, then placed."""
    import diffusers
    import torch

    cls = getattr(diffusers, spec["pipeline_class"])
    pipeline = cls.from_pretrained(str(path), dtype=getattr(torch, spec["dtype"]))
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def catalog_entries(name: str, spec: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """Three catalog entries on the same weights: `gpu-NAME` (batching), `gpu-NAME-single` (none),
    both `legacy_call`, and `gpu-NAME-cfg2`: a resident 2-rank `persistent_worker` group that splits
    classifier-free guidance across its ranks (`runtime.parallel = "cfg"`).

    The worker's model cache keys on source, class, device and dtype, so the first two share one load.
    """
    request = spec["request"]
    video = "num_frames" in request
    defaults = dict(request)
    limits: dict[str, Any] = {
        "max_width": 1280,
        "max_height": 1280,
        "max_inference_steps": 100,
        "max_num_outputs": 4,
        "max_batch_size": 4,
    }
    if video:
        defaults["fps"] = 16.0
        limits["max_num_frames"] = 81
    base = {
        "family": spec["family"],
        "tasks": ["text2video" if video else "text2image"],
        "execution_mode": "legacy_call",
        "source": str(path),
        "pipeline_class": spec["pipeline_class"],
        "defaults": defaults,
        "limits": limits,
        "runtime": {"dtype": spec["dtype"]},
    }
    cfg2 = {
        **base,
        "execution_mode": "persistent_worker",
        "limits": {**limits, "max_batch_size": 1},
        # A start loads the model on both ranks: FLUX.1-dev's 24 GB twice.
        "runtime": {"dtype": spec["dtype"], "nproc_per_node": 2, "parallel": "cfg", "start_timeout_s": 1200},
    }
    return [
        {"id": f"gpu-{name}", "supports_batching": True, **base},
        {"id": f"gpu-{name}-single", "supports_batching": False, **base},
        {"id": f"gpu-{name}-cfg2", "supports_batching": False, **cfg2},
    ]
