"""The dependency direction of LAYOUT.md (principle 4) holds, read from the imports themselves.

`tests/imports.py` reads every import of sdk/, controller/, worker/ and cli/; each rule is
checked on the repository, and on small synthetic trees that break it, so a checker that
found nothing could not pass.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.imports import Violation, check, read_all, rule_ids

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repo_violations() -> list[Violation]:
    return check(REPO)


@pytest.mark.parametrize("rule", rule_ids())
def test_the_repository_keeps_the_rule(rule: str, repo_violations: list[Violation]) -> None:
    broken = [str(v) for v in repo_violations if v.rule == rule]
    assert not broken, "\n".join(broken)


def test_the_checker_reads_the_whole_tree() -> None:
    index, imports = read_all(REPO)
    for module in ("omnirt", "omnirt._internal.convert", "omnirt.controller.server", "omnirt.cli.main"):
        assert module in index
    assert index["omnirt.worker.modes.base"] == REPO / "worker/modes/base.py"
    # The mode registry imports its executors by name; the checker must see those imports.
    names = {imp.name for imp in imports["omnirt.worker.modes.base"]}
    assert {"omnirt.worker.modes.legacy_call", "omnirt.worker.modes.subprocess.executor"} <= names
    # Function-level imports count (omnirt.generate opens its Client inside the function).
    assert "omnirt.client.Client" in {imp.name for imp in imports["omnirt"]}


# A small tree that keeps every rule: the stores and edges speak protobuf, the worker imports
# torch (reached by no controller, SDK or CLI module), the mode registry imports by name, and a
# package's `__init__` imports its own module (Python's packaging, not a cycle).
CLEAN = {
    "sdk/__init__.py": "from omnirt.types import Job\n",
    "sdk/types.py": "class Job:\n    pass\n",
    "sdk/v1/__init__.py": "",
    "sdk/v1/types_pb2.py": "from google.protobuf import descriptor\n",
    "sdk/_internal/__init__.py": "",
    "sdk/_internal/convert.py": "from omnirt.v1 import types_pb2\n",
    "cli/__init__.py": "",
    "cli/main.py": "from omnirt._internal import convert\nfrom omnirt.types import Job\n",
    "controller/__init__.py": "",
    "controller/server.py": "from omnirt.controller.core import jobs\nfrom .edges import servicers\n",
    "controller/core/__init__.py": "",
    "controller/core/jobs.py": "from omnirt import types\n",
    "controller/edges/__init__.py": "",
    "controller/edges/servicers.py": (
        "from omnirt.v1 import types_pb2\nimport omnirt._internal.protocol.v1.gateway_pb2\n"
    ),
    "controller/engines/__init__.py": "",
    "controller/engines/memory/__init__.py": "",
    "controller/engines/memory/engine.py": "from omnirt.controller.core import jobs\nfrom . import store\n",
    "controller/engines/memory/store.py": "from omnirt.v1 import types_pb2\n",
    "controller/engines/redis/__init__.py": "",
    "controller/engines/redis/engine.py": "from ...core import jobs\n",
    "worker/__init__.py": "",
    "sdk/_internal/protocol/__init__.py": "",
    "sdk/_internal/protocol/v1/__init__.py": "",
    "sdk/_internal/protocol/v1/gateway_pb2.py": "from google.protobuf import descriptor\n",
    "worker/connection.py": "from omnirt._internal.protocol.v1 import gateway_pb2\n",
    "worker/modes/__init__.py": "",
    "worker/modes/base.py": """\
        import importlib

        MODES = {"null": "omnirt.worker.modes.null"}


        def create(mode):
            return importlib.import_module(MODES[mode])
        """,
    "worker/modes/null.py": "import torch\nfrom omnirt.worker.modes.executor import Executor\n",
    "worker/modes/executor.py": "from omnirt.worker.failures import JobFailure\n",
    "worker/failures.py": "from omnirt import types\n",
    "worker/pipelines/__init__.py": "",
    "worker/pipelines/args.py": "from omnirt.worker.failures import JobFailure\nfrom . import speech\n",
    "worker/pipelines/speech.py": "from omnirt.worker.failures import JobFailure\n",
}


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source), encoding="utf-8")
    return root


def test_a_tree_that_keeps_the_rules_passes(tmp_path: Path) -> None:
    assert check(write_tree(tmp_path, CLEAN)) == []


BREAKS = {
    "cli imports the controller inside a function": (
        {"cli/status.py": "import json\n\n\ndef show():\n    from omnirt.controller import server\n"},
        {("cli->sdk", "cli/status.py", 5)},
    ),
    "the SDK imports the worker under TYPE_CHECKING": (
        {
            "sdk/testing.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from omnirt.worker.protocol import gateway_pb2
                """
        },
        {("sdk-standalone", "sdk/testing.py", 4)},
    ),
    "the controller reaches numpy through a shared helper, by a relative function-level import": (
        {
            "controller/core/jobs.py": "def run():\n    from ..._internal import tensors\n",
            "sdk/_internal/tensors.py": "import numpy as np\n",
        },
        {
            ("controller-no-model-stack", "sdk/_internal/tensors.py", 1),
            ("sdk-no-model-stack", "sdk/_internal/tensors.py", 1),
        },
    ),
    "the controller imports a worker mode by name (and through it torch)": (
        {
            "controller/core/plugins.py": """\
                import importlib

                PLUGINS = {"null": "omnirt.worker.modes.null"}


                def load(name):
                    return importlib.import_module(PLUGINS[name])
                """
        },
        {
            ("controller->sdk", "controller/core/plugins.py", 3),
            ("controller-no-model-stack", "worker/modes/null.py", 1),
        },
    ),
    "the worker imports the controller with import_module": (
        {
            "worker/daemon.py": """\
                from importlib import import_module

                server = import_module("omnirt.controller.server")
                """
        },
        {("worker->sdk", "worker/daemon.py", 3)},
    ),
    "core imports protobuf": (
        {"controller/core/jobs.py": "from omnirt import types\nfrom omnirt.v1 import types_pb2\n"},
        {("core-no-pb2", "controller/core/jobs.py", 2)},
    ),
    "core imports an engine": (
        {"controller/core/jobs.py": "from omnirt.controller.engines.memory.engine import store\n"},
        {
            ("core-alone", "controller/core/jobs.py", 1),
            # ... and the engine imports core: a cycle as well.
            ("no-cycles", "controller/core/jobs.py", 1),
            ("no-cycles", "controller/engines/memory/engine.py", 1),
        },
    ),
    "an engine (not its store) imports protobuf": (
        {"controller/engines/memory/engine.py": "from . import store\nfrom omnirt.v1.types_pb2 import Job\n"},
        {("engines-no-pb2", "controller/engines/memory/engine.py", 2)},
    ),
    "the Redis engine imports the memory engine": (
        {"controller/engines/redis/engine.py": "from ..memory.engine import store\n"},
        {("engines-apart", "controller/engines/redis/engine.py", 1)},
    ),
    "an engine imports an edge": (
        {"controller/engines/memory/engine.py": "import omnirt.controller.edges.servicers\n"},
        {("engines-apart", "controller/engines/memory/engine.py", 1)},
    ),
    "a worker mode imports protobuf": (
        {"worker/modes/null.py": "import torch\nfrom omnirt._internal.protocol.v1 import gateway_pb2\n"},
        {("modes-no-pb2", "worker/modes/null.py", 2)},
    ),
    "the controller imports the worker's generated protocol": (
        {"controller/edges/worker_stream.py": "from omnirt.worker.v1 import gateway_pb2\n"},
        {("controller->sdk", "controller/edges/worker_stream.py", 1)},
    ),
    "core imports webhooks, and observability under TYPE_CHECKING": (
        {
            "controller/core/validation.py": "from omnirt.controller.webhooks.addresses import parse_url\n",
            "controller/core/engine_client.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from omnirt.controller.observability import metrics
                """,
        },
        {
            ("core-alone", "controller/core/validation.py", 1),
            ("core-alone", "controller/core/engine_client.py", 4),
        },
    ),
    "an inner worker room imports a mode (export in a function, relatively)": (
        {
            "worker/pipelines/args.py": "from omnirt.worker.modes.executor import JobFailure\n",
            "worker/export/__init__.py": "",
            "worker/export/outputs.py": "def export(done):\n    from ..modes import events\n",
        },
        {
            ("worker-inner-rooms", "worker/pipelines/args.py", 1),
            ("worker-inner-rooms", "worker/export/outputs.py", 2),
        },
    ),
    "a cycle closed by a function-level import": (
        {"worker/pipelines/speech.py": "def check(plan):\n    from .args import ItemPlan\n"},
        {("no-cycles", "worker/pipelines/args.py", 2), ("no-cycles", "worker/pipelines/speech.py", 2)},
    ),
    "a cycle closed under TYPE_CHECKING, through a third module": (
        {
            "controller/core/jobs.py": "from omnirt.controller.core import router\n",
            "controller/core/router.py": "from omnirt.controller.core.queue import Queue\n",
            "controller/core/queue.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from omnirt.controller.core.jobs import Job
                """,
        },
        {
            ("no-cycles", "controller/core/jobs.py", 1),
            ("no-cycles", "controller/core/router.py", 1),
            ("no-cycles", "controller/core/queue.py", 4),
        },
    ),
    "a mode imports the registry that imports it by name": (
        {"worker/modes/null.py": "import torch\nfrom omnirt.worker.modes.base import MODES\n"},
        {("no-cycles", "worker/modes/base.py", 3), ("no-cycles", "worker/modes/null.py", 2)},
    ),
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_a_broken_rule_is_reported(case: str, tmp_path: Path) -> None:
    changes, expected = BREAKS[case]
    found = check(write_tree(tmp_path, {**CLEAN, **changes}))
    assert {(v.rule, str(v.path), v.line) for v in found} == expected


def test_a_cycle_is_named_by_its_shortest_loop(tmp_path: Path) -> None:
    changes, _ = BREAKS["a cycle closed under TYPE_CHECKING, through a third module"]
    found = [v for v in check(write_tree(tmp_path, {**CLEAN, **changes})) if v.rule == "no-cycles"]
    assert str(found[0]) == (
        "controller/core/jobs.py:1: `from omnirt.controller.core import router` breaks no-cycles: no import "
        "cycles (every import counts, lazy ones too): omnirt.controller.core.jobs -> "
        "omnirt.controller.core.router -> omnirt.controller.core.queue -> omnirt.controller.core.jobs"
    )


def test_a_violation_names_the_file_line_import_and_rule(tmp_path: Path) -> None:
    tree = {**CLEAN, "controller/core/jobs.py": "def run():\n    from ..._internal import tensors\n"}
    tree["sdk/_internal/tensors.py"] = "import numpy as np\n"
    (found,) = (v for v in check(write_tree(tmp_path, tree)) if v.rule == "controller-no-model-stack")
    assert str(found) == (
        "sdk/_internal/tensors.py:1: `import numpy` breaks controller-no-model-stack: the controller must "
        "not reach the model stack (numpy); reached by omnirt.controller.core.jobs -> "
        "omnirt._internal.tensors -> numpy"
    )
