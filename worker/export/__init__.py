"""Exporters: a run's images, frames and video as artifacts (`image`, `video`, `outputs`)."""
