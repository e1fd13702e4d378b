"""Regenerate the committed Python code from proto/ (run after any .proto change).

`proto/omnirt/v1` becomes the package `omnirt.v1` (folder `sdk/v1`) and
`proto/omnirt/_internal/protocol/v1` (the worker protocol, proto package `omnirt.worker.v1`)
becomes `omnirt._internal.protocol.v1` (folder `sdk/_internal/protocol/v1`), where both daemons
stand: the proto path equals the import path, so the generated imports work unchanged.
CI runs this and fails when the committed output differs (`--check`).
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"
# proto package folder -> committed folder
TARGETS = {
    Path("omnirt/v1"): ROOT / "sdk" / "v1",
    Path("omnirt/_internal/protocol/v1"): ROOT / "sdk" / "_internal" / "protocol" / "v1",
}
INIT = '"""Generated from proto/{pkg}; do not edit (scripts/gen_proto.py)."""\n'


def generate(out: Path) -> None:
    """Run protoc over every .proto file into `out`."""
    files = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    include = str(resources.files("grpc_tools") / "_proto")
    args = [
        "protoc",
        f"-I{PROTO}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for rel in TARGETS:
        (out / rel / "__init__.py").write_text(INIT.format(pkg=rel.as_posix()))


def differs(a: Path, b: Path) -> list[str]:
    """Names of files that differ between two flat folders."""
    names = {p.name for p in a.glob("*") if p.is_file()} | {p.name for p in b.glob("*") if p.is_file()}
    return sorted(
        n
        for n in names
        if not (a / n).exists() or not (b / n).exists() or not filecmp.cmp(a / n, b / n, shallow=False)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        stale: list[str] = []
        for rel, target in TARGETS.items():
            if args.check:
                stale += [f"{target.relative_to(ROOT)}/{n}" for n in differs(out / rel, target)]
            else:
                if target.exists():
                    shutil.rmtree(target)
                shutil.copytree(out / rel, target)
        if stale:
            print("generated code is stale, run: python scripts/gen_proto.py", file=sys.stderr)
            print("\n".join(stale), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
