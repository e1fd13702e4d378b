"""The dependency rules of the house (LAYOUT.md, principle 4), checked by reading imports.

Every `.py` file under sdk/, controller/, worker/ and cli/ is mapped to its import name and
parsed with `ast`; every import counts, wherever it is written: at module level, inside a
function, under `TYPE_CHECKING`, relative (resolved against the file's package), or by name
(`importlib.import_module("omnirt.x")`, and in a module that imports by a computed name,
every string naming one of our modules, as the worker's mode registry does). `check(repo)`
returns the violations, each naming the file, the line, the import and the rule.

Besides the rules on what may import what, no import cycle is allowed among the modules of
sdk/, controller/, worker/ and cli/ (`cycle_violations`). Every import counts there too: one
inside a function, under `TYPE_CHECKING` or by name still says that the module needs the other
one, so a lazy import that only breaks a cycle for the interpreter is reported like any other.
Only the package above a module is left out (importing `a.b.c` runs `a.b`'s `__init__`, but
that is Python's packaging, not a dependency the module states).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

# Source folder -> import name (pyproject.toml package-dir).
ROOTS = {"sdk": "omnirt", "controller": "omnirt.controller", "worker": "omnirt.worker", "cli": "omnirt.cli"}
# Generated protobuf packages: indexed (so imports of them resolve), never held to the rules.
GENERATED = ("omnirt.v1", "omnirt._internal.protocol.v1")
# The worker's model stack: what `pip install omnirt[controller]` (or the bare SDK) does not install.
MODEL_STACK = frozenset(
    {
        "torch",
        "torch_npu",
        "diffusers",
        "transformers",
        "accelerate",
        "peft",
        "torchao",
        "safetensors",
        "numpy",
        "PIL",
        "av",
        "ftfy",
        "sentencepiece",
        "torchsde",
    }
)
# The stores encode jobs as protobuf bytes (frozen finished jobs, Redis hashes, the Redis
# event streams): the one place under engines/ where `_pb2` is allowed.
STORES = (
    "omnirt.controller.engines.memory.store",
    "omnirt.controller.engines.redis.store",
    "omnirt.controller.engines.redis.event_log",
)

CONTROLLER, WORKER, CLI = "omnirt.controller", "omnirt.worker", "omnirt.cli"
CORE = "omnirt.controller.core"
MEMORY, REDIS = "omnirt.controller.engines.memory", "omnirt.controller.engines.redis"
EDGES, HTTP = "omnirt.controller.edges", "omnirt.controller.http"
WEBHOOKS, OBSERVABILITY = "omnirt.controller.webhooks", "omnirt.controller.observability"
MODES = "omnirt.worker.modes"
# The worker's inner rooms: how a pipeline runs, from a request to a call, outputs to artifacts.
WORKER_INNER = ("omnirt.worker.runtime", "omnirt.worker.pipelines", "omnirt.worker.export")


@dataclass(frozen=True)
class Import:
    """One import in one file: `name` as resolved (absolute), `target` the module it loads."""

    module: str
    path: Path
    line: int
    name: str
    target: str
    text: str


@dataclass(frozen=True)
class Violation:
    """One import that breaks one rule."""

    rule: str
    path: Path
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.text}` breaks {self.rule}: {self.why}"


@dataclass(frozen=True)
class Rule:
    """A direct rule: modules for which `applies` holds must not make an import `forbids` matches."""

    id: str
    why: str
    applies: Callable[[str], bool]
    forbids: Callable[[Import], bool]


def within(name: str, *packages: str) -> bool:
    """Whether `name` is one of `packages` or a module inside one."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def layer(module: str) -> str:
    """generated, controller, worker, cli or sdk (everything else under `omnirt`)."""
    if within(module, *GENERATED):
        return "generated"
    for prefix, name in ((CONTROLLER, "controller"), (WORKER, "worker"), (CLI, "cli")):
        if within(module, prefix):
            return name
    return "sdk"


def is_pb2(imp: Import) -> bool:
    """Whether the import names a generated protobuf module (`*_pb2`, `*_pb2_grpc`)."""
    return any(part.endswith(("_pb2", "_pb2_grpc")) for part in imp.name.split("."))


def module_index(repo: Path) -> dict[str, Path]:
    """Import name -> file, for every module of ours under `repo` (generated ones included)."""
    index: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = path.relative_to(repo / folder).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            index[".".join((package, *parts))] = path
    return index


def _resolve(module: str, path: Path, level: int, written: str | None) -> str:
    """The absolute name of `from <level dots><written> import ...` in `module`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    if level > 1:
        package = ".".join(package.split(".")[: -(level - 1)])
    return f"{package}.{written}" if written else package


def _is_import_module(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def read_imports(module: str, path: Path, index: dict[str, Path]) -> list[Import]:
    """Every import `module` (the file `path`) makes, in the order of the source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Import] = []

    def add(line: int, name: str, target: str, text: str) -> None:
        found.append(Import(module, path, line, name, target, text))

    by_computed_name = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.lineno, alias.name, alias.name, f"import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node.level, node.module) if node.level else node.module or ""
            written = "." * node.level + (node.module or "")
            for alias in node.names:
                name = base if alias.name == "*" else f"{base}.{alias.name}"
                add(
                    alias.lineno, name, name if name in index else base, f"from {written} import {alias.name}"
                )
        elif isinstance(node, ast.Call) and _is_import_module(node) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                add(node.lineno, arg.value, arg.value, ast.unparse(node))
            else:
                by_computed_name = True
    if by_computed_name:
        # A registry of module names (worker/modes/base.py `_EXECUTORS`, omnirt's lazy
        # attributes): each of our modules it names is imported when asked for.
        literal = {(imp.line, imp.name) for imp in found}
        for node in ast.walk(tree):
            named = isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in index
            if named and (node.lineno, node.value) not in literal:
                add(node.lineno, node.value, node.value, f'"{node.value}" (imported by name)')
    return sorted(found, key=lambda imp: imp.line)


def read_all(repo: Path) -> tuple[dict[str, Path], dict[str, list[Import]]]:
    """The module index and every module's imports."""
    index = module_index(repo)
    return index, {module: read_imports(module, path, index) for module, path in index.items()}


def _not_stores(module: str) -> bool:
    return not within(module, *STORES)


RULES = (
    Rule(
        "cli->sdk",
        "the CLI calls only the SDK (omnirt, omnirt._internal), never omnirt.controller or omnirt.worker",
        lambda m: layer(m) == "cli",
        lambda imp: within(imp.name, CONTROLLER, WORKER),
    ),
    Rule(
        "sdk-standalone",
        "the SDK (omnirt, omnirt._internal) imports none of omnirt.controller, omnirt.worker, omnirt.cli",
        lambda m: layer(m) == "sdk",
        lambda imp: within(imp.name, CONTROLLER, WORKER, CLI),
    ),
    Rule(
        "controller->sdk",
        "the controller imports the SDK and the shared internals (the worker protocol included: "
        "omnirt._internal.protocol), never omnirt.worker or the CLI",
        lambda m: layer(m) == "controller",
        lambda imp: within(imp.name, WORKER, CLI),
    ),
    Rule(
        "worker->sdk",
        "the worker imports the SDK and the shared internals, never omnirt.controller or the CLI",
        lambda m: layer(m) == "worker",
        lambda imp: within(imp.name, CONTROLLER, CLI),
    ),
    Rule(
        "core-no-pb2",
        "protobuf stops at the edges: controller/core imports no _pb2 module",
        lambda m: within(m, CORE),
        is_pb2,
    ),
    Rule(
        "engines-no-pb2",
        "protobuf stops at the edges: an engine (queue, batching, executor side) imports no _pb2 module; "
        "only the stores (memory/store.py, redis/store.py and its event_log.py) may",
        lambda m: within(m, "omnirt.controller.engines") and _not_stores(m),
        is_pb2,
    ),
    Rule(
        "core-alone",
        "controller/core imports no engine, edge, http, webhooks or observability module (what it "
        "needs of them is injected)",
        lambda m: within(m, CORE),
        lambda imp: within(imp.name, "omnirt.controller.engines", EDGES, HTTP, WEBHOOKS, OBSERVABILITY),
    ),
    Rule(
        "engines-apart",
        "an engine imports neither the other engine nor edges/http",
        lambda m: within(m, MEMORY, REDIS),
        lambda imp: (
            within(imp.name, EDGES, HTTP) or within(imp.name, REDIS if within(imp.module, MEMORY) else MEMORY)
        ),
    ),
    Rule(
        "modes-no-pb2",
        "protobuf stops at the worker's edge: worker/modes imports no _pb2 module",
        lambda m: within(m, MODES),
        is_pb2,
    ),
    Rule(
        "worker-inner-rooms",
        "the worker's inner rooms (runtime, pipelines, export) never import the execution modes "
        "(worker/modes): what they need of a mode is injected",
        lambda m: within(m, *WORKER_INNER),
        lambda imp: within(imp.name, MODES),
    ),
)

# Import groups that must never reach the model stack, by the first module of each.
REACH_GROUPS = {
    "controller-no-model-stack": ("the controller", lambda m: layer(m) == "controller"),
    "sdk-no-model-stack": ("the SDK", lambda m: layer(m) == "sdk"),
    "cli-no-model-stack": ("the CLI", lambda m: layer(m) == "cli"),
}


def imported_module(imp: Import, index: dict[str, Path]) -> str:
    """The module of ours `imp` loads (its target, or the nearest package of it we have), or ""."""
    name = imp.target
    while name and name not in index:
        name = name.rpartition(".")[0]
    return name


def _edges(module: str, imports: list[Import], index: dict[str, Path]) -> Iterable[str]:
    """The modules of ours that importing `module` runs: its parent package and what it imports."""
    parent = module.rpartition(".")[0]
    if parent in index:
        yield parent
    for imp in imports:
        name = imported_module(imp, index)
        if name:
            yield name


def reach_violations(
    rule: str,
    who: str,
    start: Callable[[str], bool],
    index: dict[str, Path],
    imports: dict[str, list[Import]],
) -> list[Violation]:
    """Model-stack imports reachable (transitively, through our own modules) from the `start` modules."""
    # Breadth first from all start modules at once: each module is reached by a shortest chain.
    chain: dict[str, tuple[str, ...]] = {m: (m,) for m in index if start(m)}
    todo = deque(chain)
    while todo:
        module = todo.popleft()
        for nxt in _edges(module, imports[module], index):
            if nxt not in chain:
                chain[nxt] = (*chain[module], nxt)
                todo.append(nxt)
    found = []
    for module, via in chain.items():
        for imp in imports[module]:
            top = imp.name.partition(".")[0]
            if top in MODEL_STACK:
                path = " -> ".join((*via, imp.name))
                why = f"{who} must not reach the model stack ({top}); reached by {path}"
                found.append(Violation(rule, imp.path, imp.line, imp.text, why))
    return found


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of `graph` with more than one module (Tarjan, iterative)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in order:
            continue
        work = [(root, iter(sorted(graph[root])))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in order:
                    order[child] = low[child] = len(order)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], order[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == order[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def _path(graph: dict[str, set[str]], start: str, goal: str, allowed: set[str]) -> list[str]:
    """A shortest chain of imports from `start` to `goal` through the modules of `allowed`."""
    came: dict[str, str] = {start: start}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            break
        for nxt in sorted(graph[node] & allowed):
            if nxt not in came:
                came[nxt] = node
                todo.append(nxt)
    path = [goal]
    while path[-1] != start:
        path.append(came[path[-1]])
    return path[::-1]


def cycle_violations(index: dict[str, Path], imports: dict[str, list[Import]]) -> list[Violation]:
    """Every import that closes an import cycle among our modules (generated code aside).

    Each import from one module of a cycle to another is reported, with the shortest cycle it is
    part of: each is a place where the cycle could be cut.
    """
    ours = {m for m in index if layer(m) != "generated"}
    graph: dict[str, set[str]] = {m: set() for m in ours}
    for module in ours:
        for imp in imports[module]:
            target = imported_module(imp, index)
            if target in ours and target != module:
                graph[module].add(target)
    found = []
    for component in _cycles(graph):
        for module in sorted(component):
            for imp in imports[module]:
                target = imported_module(imp, index)
                if target in component and target != module:
                    cycle = " -> ".join([module, *_path(graph, target, module, component)])
                    why = f"no import cycles (every import counts, lazy ones too): {cycle}"
                    found.append(Violation("no-cycles", imp.path, imp.line, imp.text, why))
    return found


def check(repo: Path) -> list[Violation]:
    """Every violation of the dependency rules in the tree at `repo`."""
    index, imports = read_all(repo)
    found = []
    for module, module_imports in imports.items():
        if layer(module) == "generated":
            continue
        for rule in RULES:
            if rule.applies(module):
                for imp in module_imports:
                    if rule.forbids(imp):
                        found.append(Violation(rule.id, imp.path, imp.line, imp.text, rule.why))
    for rule_id, (who, start) in REACH_GROUPS.items():
        found.extend(reach_violations(rule_id, who, start, index, imports))
    found.extend(cycle_violations(index, imports))
    return [replace(v, path=v.path.relative_to(repo)) for v in found]


def rule_ids() -> list[str]:
    """The id of every rule `check` applies."""
    return [rule.id for rule in RULES] + list(REACH_GROUPS) + ["no-cycles"]
