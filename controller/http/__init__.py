"""The controller's HTTP edge: the JSON gateway, event streams, OpenAI routes and /metrics."""

from omnirt.controller.http.app import HttpGateway

__all__ = ["HttpGateway"]
