"""The house rules that are not imports (LAYOUT.md, second pass): small modules, few reasoned ignores.

Every hand-written module of sdk/, controller/, worker/ and cli/ (generated code aside) stays
under 600 lines, and the tree carries at most 10 `# type: ignore`, each with its reason written
after it on the line. Each rule is also checked on a small tree that breaks it.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("sdk", "controller", "worker", "cli")
GENERATED = ("sdk/v1/", "sdk/_internal/protocol/v1/")
MAX_LINES = 600
MAX_IGNORES = 10
# `# type: ignore[code]` then a comment giving the reason: `# type: ignore[x]  # why`.
IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(?P<rest>.*)$")


def sources(root: Path) -> list[Path]:
    """The hand-written Python modules under `root`'s source folders."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            if not path.relative_to(root).as_posix().startswith(GENERATED):
                found.append(path)
    return found


def long_modules(root: Path) -> list[str]:
    """`path: lines` of each module over MAX_LINES."""
    out = []
    for path in sources(root):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            out.append(f"{path.relative_to(root)}: {lines} lines")
    return out


def ignores(root: Path) -> tuple[list[str], list[str]]:
    """Every `type: ignore` as `path:line`, and those without a reason after them."""
    every, unreasoned = [], []
    for path in sources(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = IGNORE.search(line)
            if match is None:
                continue
            where = f"{path.relative_to(root)}:{number}"
            every.append(where)
            if not match.group("rest").strip().lstrip("#").strip():
                unreasoned.append(where)
    return every, unreasoned


def test_no_module_is_over_600_lines() -> None:
    assert not long_modules(REPO), "split these along a seam:\n" + "\n".join(long_modules(REPO))


def test_at_most_10_type_ignores_each_with_its_reason() -> None:
    every, unreasoned = ignores(REPO)
    assert len(every) <= MAX_IGNORES, f"{len(every)} `type: ignore`s:\n" + "\n".join(every)
    assert not unreasoned, "say why on the line:\n" + "\n".join(unreasoned)


def test_the_rules_catch_a_tree_that_breaks_them(tmp_path: Path) -> None:
    (tmp_path / "sdk" / "v1").mkdir(parents=True)
    (tmp_path / "worker").mkdir()
    (tmp_path / "sdk" / "v1" / "big_pb2.py").write_text("x = 1\n" * 900)  # generated: not counted
    (tmp_path / "worker" / "big.py").write_text("x = 1\n" * 601)
    reasons = [f"y{i} = f()  # type: ignore[misc]  # the stub is wrong\n" for i in range(MAX_IGNORES)]
    (tmp_path / "sdk" / "ok.py").write_text("".join(reasons))
    (tmp_path / "worker" / "bare.py").write_text("z = g()  # type: ignore[arg-type]\n")
    assert long_modules(tmp_path) == ["worker/big.py: 601 lines"]
    every, unreasoned = ignores(tmp_path)
    assert len(every) == MAX_IGNORES + 1 and unreasoned == ["worker/bare.py:1"]
