"""The public surface of `omnirt` and the promise that importing it stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import omnirt


def test_all_is_pinned() -> None:
    assert omnirt.__all__ == [
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
    for name in omnirt.__all__:
        assert getattr(omnirt, name) is not None


def test_version() -> None:
    assert omnirt.__version__ == "0.1.0"


def test_lazy_names_are_the_real_ones() -> None:
    from omnirt import errors as errors_module
    from omnirt.aio import AsyncClient
    from omnirt.client import Client

    assert omnirt.Client is Client
    assert omnirt.AsyncClient is AsyncClient
    assert omnirt.errors is errors_module
    assert issubclass(omnirt.errors.ModelNotFound, omnirt.errors.OmniRTError)


def _loaded_after(statement: str) -> set[str]:
    code = (
        f"{statement}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(json.loads(out))


def test_import_omnirt_loads_no_torch_and_no_grpc() -> None:
    loaded = _loaded_after("import omnirt")
    assert not loaded & {"torch", "diffusers", "transformers", "numpy"}
    assert "grpc" not in loaded  # clients load on first use


def test_cli_and_clients_load_no_torch() -> None:
    loaded = _loaded_after("import omnirt, omnirt.cli.main, omnirt.client, omnirt.aio; omnirt.Client")
    assert not loaded & {"torch", "diffusers", "transformers"}
    assert "rich" not in loaded  # only a progress bar on a terminal loads it
