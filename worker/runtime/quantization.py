"""Weight quantization of the denoiser at load time, through diffusers' `TorchAoConfig` (torchao).

`runtime.quantization = "int8_weight_only"` (or `{backend = "torchao", method = "..."}`) loads
the model with `PipelineQuantizationConfig(quant_mapping={denoiser: TorchAoConfig(...)})`: the
denoiser's linear layers hold torchao tensors (int8 or float8 weights with scales); the text
encoder and the VAE are left as they are.

Methods and where they run (torch 2.13 CPU wheel with torchao 0.18, checked on the tiny models):

| method | torchao config | cpu | cuda |
|---|---|---|---|
| `int8_weight_only` | `Int8WeightOnlyConfig` | yes | yes |
| `int8_dynamic_activation_int8_weight` | `Int8DynamicActivationInt8WeightConfig` | yes | yes |
| `float8_weight_only` | `Float8WeightOnlyConfig` | yes | yes |
| `int4_weight_only` | `Int4WeightOnlyConfig` | no (needs CUDA kernels) | yes |

torchao is not supported on the ascend backend.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TORCHAO_CONFIGS = {
    "int8_weight_only": "Int8WeightOnlyConfig",
    "int8_dynamic_activation_int8_weight": "Int8DynamicActivationInt8WeightConfig",
    "float8_weight_only": "Float8WeightOnlyConfig",
    "int4_weight_only": "Int4WeightOnlyConfig",
}
CPU_METHODS = frozenset({"int8_weight_only", "int8_dynamic_activation_int8_weight", "float8_weight_only"})
DENOISERS = ("unet", "transformer", "transformer_2")  # transformer_2: Wan 2.2 A14B's low-noise expert


def problem(settings: Mapping[str, str], device: str) -> str:
    """Why `settings` cannot run on `device` ("" when they can)."""
    method = settings.get("method", "")
    kind = device.split(":")[0]
    if kind == "npu":
        return "torchao quantization is not supported on the ascend backend"
    if kind == "cpu" and method not in CPU_METHODS:
        usable = ", ".join(sorted(CPU_METHODS))
        return f"{method} has no CPU kernels in torchao; on the cpu backend use one of {usable}"
    try:
        import torchao  # noqa: F401
    except ImportError:
        return "needs the torchao package (pip install 'omnirt[worker]')"
    return ""


def denoiser_names(location: str) -> list[str]:
    """The denoiser components of the pipeline at `location` (both names for a hub id)."""
    index = Path(location) / "model_index.json"
    try:
        components = json.loads(index.read_text())
    except (OSError, ValueError):
        return list(DENOISERS)
    return [name for name in DENOISERS if name in components] or list(DENOISERS)


def pipeline_config(settings: Mapping[str, str], location: str) -> Any:
    """The `from_pretrained(quantization_config=...)` value that quantizes the denoiser."""
    import torchao.quantization
    from diffusers import PipelineQuantizationConfig, TorchAoConfig

    config_class = getattr(torchao.quantization, TORCHAO_CONFIGS[settings["method"]])
    mapping: dict[str, Any] = {name: TorchAoConfig(config_class()) for name in denoiser_names(location)}
    return PipelineQuantizationConfig(quant_mapping=mapping)


# Loggers that say, when torchao is imported (transformers and diffusers import it whenever it
# is installed), things that do not matter here: torchao's prebuilt CUDA kernels (cutlass,
# mxfp8) do not load on a CPU-only torch, Triton is absent on CPU, diffusers cannot import
# torchao's older tensor classes (only for checkpoints saved quantized), and torch 2.13
# deprecates how torchao registers two enums; without torchvision (not a dependency: PyPI's
# build does not import beside the pinned torch), transformers says at every first load that it
# uses its PIL image processors instead. diffusers also says integer quantization supports
# only bfloat16, but float32 weight-only int8 runs (and matches) on CPU: tested.
NOISY_LOGGERS = (
    "torchao",
    "torchao.kernel.intmm",
    "diffusers.quantizers.torchao.torchao_quantizer",
    "torch.utils._pytree",
    "transformers.utils.import_utils",
)
NOISE = (
    "Failed to load",
    "Detected no triton",
    "Unable to import `torchao`",
    "is an Enum subclass",
    "for integer quantization, but only bfloat16 is supported",
    # Stable Diffusion's feature extractor: transformers falls back to its PIL image processor.
    "requires torchvision (not installed); falling back to",
)


class _KnownNoise(logging.Filter):
    """Drops the import-time messages listed in `NOISE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not any(marker in text for marker in NOISE)


def quiet_import_logs() -> None:
    """Install `_KnownNoise` on `NOISY_LOGGERS` (idempotent); call it before diffusers loads models."""
    for name in NOISY_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _KnownNoise) for f in logger.filters):
            logger.addFilter(_KnownNoise())
