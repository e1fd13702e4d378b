"""Random-weight pipelines of published sizes for `bench.gpu`, built offline from bench/gpu_configs.json.

`sd15`: Stable Diffusion 1.5 (UNet 860M, VAE 84M, CLIP ViT-L/14 text encoder 123M parameters).
`wan`: Wan 2.1 text-to-video 1.3B (the transformer and the VAE at their published configs; the
UMT5 text encoder cut to 2 layers, see the JSON's `text_encoder_note`). Tokenizers are the
offline ones of OmniRT's tiny models (no hub). Modules are created directly on the target
device (random init of a billion parameters on a CPU takes minutes), cast to the benchmark's
dtype and saved with `save_pretrained`, so the worker loads them with `from_pretrained` like any
local model.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

CONFIGS = Path(__file__).with_name("gpu_configs.json")
MODELS = ("sd15", "wan")


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


def _build_sd15(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKL, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from omnirt.worker.tiny.tokenizers import write_clip_tokenizer_files

    with tempfile.TemporaryDirectory() as vocab_dir:
        write_clip_tokenizer_files(Path(vocab_dir))
        tokenizer = CLIPTokenizer.from_pretrained(vocab_dir, model_max_length=77)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    with torch.device(device):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**spec["unet"])
        vae = AutoencoderKL(**spec["vae"])
        text_encoder = CLIPTextModel(CLIPTextConfig(**spec["text_encoder"], **special))
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


def _build_wan(spec: dict[str, Any], device: str) -> Any:
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel
    from transformers import T5Tokenizer, UMT5Config, UMT5EncoderModel

    from omnirt.worker.tiny.tokenizers import t5_vocabulary

    tokenizer = T5Tokenizer(vocab=t5_vocabulary(), extra_ids=0)
    transformer_config = dict(spec["transformer"])
    transformer_config["patch_size"] = tuple(transformer_config["patch_size"])
    with torch.device(device):
        torch.manual_seed(0)
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tokenizer),
                **spec["text_encoder"],
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                decoder_start_token_id=tokenizer.pad_token_id,
            )
        )
        vae = AutoencoderKLWan(**spec["vae"])
        transformer = WanTransformer3DModel(**transformer_config)
    return WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=_scheduler(spec["scheduler"]),
    )


def build(name: str, spec: dict[str, Any], target: Path, device: str) -> dict[str, Any]:
    """Build model `name` into `target` (random weights, `spec["dtype"]`); parameter counts per module."""
    import torch

    pipeline = _build_sd15(spec, device) if name == "sd15" else _build_wan(spec, device)
    pipeline.to(dtype=getattr(torch, spec["dtype"]))
    params = {
        module: sum(p.numel() for p in getattr(pipeline, module).parameters())
        for module in ("unet", "transformer", "vae", "text_encoder")
        if getattr(pipeline, module, None) is not None
    }
    pipeline.save_pretrained(str(target))
    del pipeline
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return params


def load(spec: dict[str, Any], path: Path, device: str) -> Any:
    """The saved pipeline loaded as the worker loads it: `from_pretrained(path, dtype=...)`, then placed."""
    import diffusers
    import torch

    cls = getattr(diffusers, spec["pipeline_class"])
    pipeline = cls.from_pretrained(str(path), dtype=getattr(torch, spec["dtype"]))
    pipeline.set_progress_bar_config(disable=True)
    return pipeline.to(device)


def catalog_entries(name: str, spec: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    """Two catalog entries on the same weights: `gpu-NAME` (batching) and `gpu-NAME-single` (none).

    The worker's model cache keys on source, class, device and dtype, so both share one load.
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
        "family": "wan" if video else "sd",
        "tasks": ["text2video" if video else "text2image"],
        "execution_mode": "legacy_call",
        "source": str(path),
        "pipeline_class": spec["pipeline_class"],
        "defaults": defaults,
        "limits": limits,
        "runtime": {"dtype": spec["dtype"]},
    }
    return [
        {"id": f"gpu-{name}", "supports_batching": True, **base},
        {"id": f"gpu-{name}-single", "supports_batching": False, **base},
    ]
