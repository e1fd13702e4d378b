"""The `modular` mode: a diffusers pipeline run stage by stage (text encode, denoise, decode)."""
