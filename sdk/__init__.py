"""OmniRT: a gRPC-first serving runtime for generative models — the Python SDK.

    import omnirt

    result = omnirt.generate(model="tiny-sd", prompt="a red fox", seed=42)
    result.save("outputs")

`Client` (and `AsyncClient`) talk to one controller; `omnirt.generate` and `omnirt.validate`
open a client on `$OMNIRT_CONTROLLER` (else 127.0.0.1:50051) for one call. Failed calls raise
the typed errors of `omnirt.errors`. The clients and gRPC load on first use, so
`import omnirt` stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnirt.types import (
    Adapter,
    Artifact,
    EventKind,
    GenerateRequest,
    GenerateResult,
    Job,
    JobError,
    JobEvent,
    JobState,
    MediaInput,
    MediaKind,
    MediaRole,
    ModelSpec,
    Progress,
    RunReport,
    Task,
    ValidationResult,
    Webhook,
    WebhookEvent,
    WorkerInfo,
)

if TYPE_CHECKING:
    from omnirt import errors
    from omnirt.aio import AsyncClient
    from omnirt.client import Client

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "Artifact",
    "AsyncClient",
    "Client",
    "EventKind",
    "GenerateRequest",
    "GenerateResult",
    "Job",
    "JobError",
    "JobEvent",
    "JobState",
    "MediaInput",
    "MediaKind",
    "MediaRole",
    "ModelSpec",
    "Progress",
    "RunReport",
    "Task",
    "ValidationResult",
    "Webhook",
    "WebhookEvent",
    "WorkerInfo",
    "__version__",
    "errors",
    "generate",
    "validate",
]

_LAZY = {"Client": ("omnirt.client", "Client"), "AsyncClient": ("omnirt.aio", "AsyncClient")}


def __getattr__(name: str) -> Any:
    # Lazy: grpc (and grpc.aio) load only when a client or the errors are first used.
    if name == "errors":
        return importlib.import_module("omnirt.errors")
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'omnirt' has no attribute {name!r}")


def generate(
    request: GenerateRequest | None = None, *, address: str | None = None, **fields: Any
) -> GenerateResult:
    """Run one generation on the controller at `address` (default `$OMNIRT_CONTROLLER`).

    Takes the keywords of `Client.generate` (model=, prompt=, ..., timeout=).
    """
    from omnirt.client import Client

    with Client(address) as client:
        return client.generate(request, **fields)


def validate(
    request: GenerateRequest | None = None, *, address: str | None = None, **fields: Any
) -> ValidationResult:
    """Resolve a request into its execution plan on the controller at `address`, without running it."""
    from omnirt.client import Client

    with Client(address) as client:
        return client.validate(request, **fields)
