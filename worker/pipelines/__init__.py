"""Diffusers pipeline plumbing: call arguments per task, media inputs, the model cache."""
