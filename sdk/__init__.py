"""OmniRT: a gRPC-first serving runtime for generative models — the Python SDK.

    import omnirt

    result = omnirt.generate(model="tiny-sd", prompt="a red fox", seed=42)
    result.save("outputs")

`Client` (and `AsyncClient`) talk to one controller; `omnirt.generate` and `omnirt.validate`
open a client on `$OMNIRT_CONTROLLER` (else 127.0.0.1:50051) for one call. Failed calls raise
the typed errors of `omnirt.errors`. The clients and gRPC load on first use, so
`import omnirt` stays light.

The original OmniRT's code runs as it is: `omnirt.generate` and `omnirt.validate` also take
its request (a dict, a YAML or JSON file, an `omnirt.requests` builder's object) and answer in
its shape, and `omnirt.list_available_models` / `omnirt.describe_model` list the catalog as
its registry (`omnirt.original`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, overload

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
    from omnirt import errors, original, requests
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
    "describe_model",
    "errors",
    "generate",
    "list_available_models",
    "requests",
    "validate",
]

_LAZY = {"Client": ("omnirt.client", "Client"), "AsyncClient": ("omnirt.aio", "AsyncClient")}


def __getattr__(name: str) -> Any:
    # Lazy: grpc (and grpc.aio) load only when a client or the errors are first used.
    if name in ("errors", "requests"):
        return importlib.import_module(f"omnirt.{name}")
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'omnirt' has no attribute {name!r}")


@overload
def generate(
    request: GenerateRequest | None = None,
    *,
    address: str | None = None,
    api_key: str | None = None,
    **fields: Any,
) -> GenerateResult: ...
@overload
def generate(
    request: requests.OriginalRequest | Mapping[str, Any] | str | os.PathLike[str],
    *,
    address: str | None = None,
    api_key: str | None = None,
    backend: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> original.GenerateResult: ...
def generate(
    request: Any = None,
    *,
    address: str | None = None,
    api_key: str | None = None,
    backend: str | None = None,
    output_dir: str | os.PathLike[str] | None = None,
    **fields: Any,
) -> Any:
    """Run one generation on the controller at `address` (default `$OMNIRT_CONTROLLER`).

    `api_key` defaults to `$OMNIRT_API_KEY`. Takes the keywords of `Client.generate` (model=,
    prompt=, ..., timeout=) or a `GenerateRequest`, and returns a `GenerateResult`. Given the
    original OmniRT's request (a dict, a YAML or JSON file path, an `omnirt.requests` object)
    it answers as the original did: an `omnirt.original.GenerateResult` whose outputs were
    saved into `output_dir` (default: the request's `config.output_dir`, else `outputs`);
    `backend` overrides the request's, `timeout` (s) is the call's deadline.
    """
    from omnirt.client import Client

    with Client(address, api_key=api_key) as client:
        if request is not None and not isinstance(request, GenerateRequest):
            from omnirt import original

            if original.is_request_like(request):
                timeout = _only_timeout(fields, "the original's request")
                return original.generate(
                    client, request, backend=backend, output_dir=output_dir, timeout=timeout
                )
        if backend is not None or output_dir is not None:
            raise TypeError("backend= and output_dir= go with the original's requests (a dict, a file path)")
        return client.generate(request, **fields)


@overload
def validate(
    request: GenerateRequest | None = None,
    *,
    address: str | None = None,
    api_key: str | None = None,
    **fields: Any,
) -> ValidationResult: ...
@overload
def validate(
    request: requests.OriginalRequest | Mapping[str, Any] | str | os.PathLike[str],
    *,
    address: str | None = None,
    api_key: str | None = None,
    backend: str | None = None,
    timeout: float | None = None,
) -> original.ValidationResult: ...
def validate(
    request: Any = None,
    *,
    address: str | None = None,
    api_key: str | None = None,
    backend: str | None = None,
    **fields: Any,
) -> Any:
    """Resolve a request into its execution plan on the controller at `address`, without running it.

    A refused request raises `omnirt.errors.InvalidRequest`. Given the original OmniRT's request
    it answers as the original did: an `omnirt.original.ValidationResult` whose `ok` is False
    and whose `issues` say why when the request is refused.
    """
    from omnirt.client import Client

    with Client(address, api_key=api_key) as client:
        if request is not None and not isinstance(request, GenerateRequest):
            from omnirt import original

            if original.is_request_like(request):
                timeout = _only_timeout(fields, "the original's request")
                return original.validate(client, request, backend=backend, timeout=timeout)
        if backend is not None:
            raise TypeError("backend= goes with the original's requests (a dict, a file path)")
        return client.validate(request, **fields)


def _only_timeout(fields: dict[str, Any], what: str) -> float | None:
    timeout = fields.pop("timeout", None)
    if fields:
        raise TypeError(f"{what} carries its own fields; unexpected keyword(s): {', '.join(sorted(fields))}")
    return timeout


def list_available_models(
    *,
    include_aliases: bool = True,
    tier: str | None = None,
    address: str | None = None,
    api_key: str | None = None,
) -> list[original.ModelSpec]:
    """The controller's catalog as the original OmniRT listed its models.

    `omnirt.original.ModelSpec`s, one per id, aliases too unless `include_aliases` is False,
    sorted by id; every entry reads as `tier` "core". `Client.list_models` gives OmniRT's own
    `ModelSpec`.
    """
    from omnirt import original
    from omnirt.client import Client

    if tier is not None and tier not in original.TIERS:
        raise ValueError(f"Unknown model tier: {tier!r} (known: {', '.join(original.TIERS)})")
    with Client(address, api_key=api_key) as client:
        return original.list_models(client, include_aliases=include_aliases, tier=tier)


def describe_model(
    model_id: str, *, task: str | None = None, address: str | None = None, api_key: str | None = None
) -> original.ModelSpec:
    """One model (id or alias) as the original OmniRT described it, for `task` (default: its first).

    `omnirt.errors.ModelNotFound` when the catalog lacks it (or it does not do `task`).
    `Client.describe_model` gives OmniRT's own `ModelSpec`.
    """
    from omnirt import original
    from omnirt.client import Client

    with Client(address, api_key=api_key) as client:
        return original.describe(client, model_id, task=task)
