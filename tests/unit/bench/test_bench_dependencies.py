"""The benchmark suite runs after the README's own set-up: every package `bench/` imports is
installed by the extras `scripts/demo.sh` (and `scripts/setup.sh`'s default) installs."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[3]


def imported_packages() -> set[str]:
    """Top-level modules `bench/*.py` imports, anywhere in a file (local and stdlib ones aside)."""
    names: set[str] = set()
    for path in (ROOT / "bench").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("bench", "omnirt")}


def installed_closure(extras: list[str]) -> set[str]:
    """The distributions `omnirt[extras]` (as pyproject.toml says) pulls in, transitively (their
    own requirements as installed here)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = [
        *project.get("dependencies", []),
        *(r for e in extras for r in project["optional-dependencies"][e]),
    ]
    todo = [Requirement(text) for text in texts]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            sub = Requirement(text)
            if sub.marker is None or sub.marker.evaluate({"extra": ""}):
                todo.append(sub)
    return seen


def test_the_readme_setup_installs_what_the_benchmarks_import() -> None:
    line = re.search(r"scripts/setup\.sh ([\w,]+)", (ROOT / "scripts" / "demo.sh").read_text())
    assert line, "demo.sh installs with scripts/setup.sh EXTRAS"
    extras = line.group(1).split(",")
    default = re.search(r"extras=\$\{1:-([\w,]+)\}", (ROOT / "scripts" / "setup.sh").read_text())
    assert default and set(extras) <= set(default.group(1).split(",")), "setup.sh alone installs as much"
    closure = installed_closure(extras)
    providers = metadata.packages_distributions()
    missing = {
        module: providers.get(module, ["?"])
        for module in imported_packages()
        if not any(re.sub(r"[-_.]+", "-", d).lower() in closure for d in providers.get(module, []))
    }
    assert not missing, f"bench imports what {','.join(extras)} does not install: {missing}"
