"""How a model runs on this worker: runtime options, backends and devices, dtype and quantization,
step caches, inference mode, LoRA adapters and memory accounting."""
