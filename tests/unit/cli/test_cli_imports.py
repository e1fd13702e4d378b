"""The CLI calls the SDK: it imports no generated protobuf code and no protobuf runtime
(issue 29). `tests/imports.py` reads the imports, wherever they are written."""

from __future__ import annotations

from pathlib import Path

from tests.imports import is_pb2, read_all

REPO = Path(__file__).resolve().parents[3]


def test_the_cli_imports_no_generated_code_and_no_protobuf() -> None:
    _, imports = read_all(REPO)
    cli = {module: found for module, found in imports.items() if module.startswith("omnirt.cli.")}
    assert "omnirt.cli.bench_requests" in cli
    wrong = [
        f"{imp.path.relative_to(REPO)}:{imp.line}: {imp.text}"
        for found in cli.values()
        for imp in found
        if is_pb2(imp) or imp.name.startswith(("omnirt.v1", "omnirt._internal.protocol", "google.protobuf"))
    ]
    assert not wrong, "\n".join(wrong)
