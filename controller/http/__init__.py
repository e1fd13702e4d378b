"""The controller's HTTP edge: the JSON gateway, event streams, OpenAI routes and /metrics."""

from .app import HttpGateway

__all__ = ["HttpGateway"]
