"""Prometheus metrics and OpenTelemetry traces of the controller's jobs and calls."""
