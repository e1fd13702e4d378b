"""The mode registry: `ExecutionMode` -> its executor, made by name (`create_executor`).

Implementations are imported lazily by name so that importing this module stays light. The
interface they implement (`Executor`, `CancelFlags`, ...) is `omnirt.worker.modes.executor`,
which the modes import; only the daemon imports this module, so no mode imports its registry.

A model family that needs no mode of its own (`null`: no compute) has a `FamilyExecutor`; the
workers of the modes that serve it get it in front of their mode's executor (`FamilyRouter`),
so its models run there whatever the mode, and the modes themselves never ask for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from omnirt import types as t
from omnirt._internal.modes import EXECUTION_MODES, ExecutionMode
from omnirt._internal.protocol.messages import Assignment, ItemOutcome
from omnirt.worker.modes.executor import CancelFlags, EventSink, Executor, FamilyExecutor
from omnirt.worker.realtime.api import OpenRequest, StreamingSession

if TYPE_CHECKING:
    from omnirt.worker.config import WorkerConfig

# execution mode -> (module, class): a new mode is its folder here and one line below.
_EXECUTORS: dict[ExecutionMode, tuple[str, str]] = {
    ExecutionMode.LEGACY_CALL: ("omnirt.worker.modes.legacy_call", "LegacyCallExecutor"),
    ExecutionMode.MODULAR: ("omnirt.worker.modes.modular.executor", "ModularExecutor"),
    ExecutionMode.SUBPROCESS: ("omnirt.worker.modes.subprocess.executor", "SubprocessExecutor"),
    ExecutionMode.PERSISTENT_WORKER: ("omnirt.worker.modes.persistent.executor", "PersistentWorkerExecutor"),
}
# Families with an executor of their own -> (module, class, the modes whose workers run them).
# The null model's catalog entry names legacy_call; a modular worker serves it too.
_FAMILY_EXECUTORS: dict[str, tuple[str, str, frozenset[ExecutionMode]]] = {
    "null": (
        "omnirt.worker.modes.null",
        "NullExecutor",
        frozenset({ExecutionMode.LEGACY_CALL, ExecutionMode.MODULAR}),
    ),
}


class FamilyRouter(Executor):
    """A mode's executor with the family executors it hosts in front of it.

    An assignment or a preload of a family's model goes to that family's executor; everything
    else, and every question about the worker's models, to the mode's executor.
    """

    def __init__(self, executor: Executor, families: list[FamilyExecutor]) -> None:
        self.executor = executor
        self.families = families
        self.mode = executor.mode

    def _for(self, spec: t.ModelSpec) -> Executor:
        for family in self.families:
            if family.serves(spec):
                return family
        return self.executor

    @property
    def backend(self) -> str:
        """The mode's backend (the family executors report it too)."""
        return self.executor.backend

    async def start(self) -> None:
        """Start the mode's executor."""
        await self.executor.start()

    async def run(self, assignment: Assignment, emit: EventSink, flags: CancelFlags) -> list[ItemOutcome]:
        """Run `assignment` on its model family's executor, else on the mode's."""
        return await self._for(assignment.model).run(assignment, emit, flags)

    def loaded_models(self) -> list[str]:
        """The mode's loaded models (a family executor holds none)."""
        return self.executor.loaded_models()

    async def preload(self, spec: t.ModelSpec) -> None:
        """Preload `spec` on its model family's executor, else on the mode's."""
        await self._for(spec).preload(spec)

    def model_memory(self) -> dict[str, int]:
        """The mode's loaded models' bytes."""
        return self.executor.model_memory()

    def step_engine(self) -> tuple[int, list[str]]:
        """The mode's step engine."""
        return self.executor.step_engine()

    async def unload(self, model_id: str) -> bool:
        """Unload `model_id` from the mode's executor."""
        return await self.executor.unload(model_id)

    def open_session(self, request: OpenRequest) -> StreamingSession:
        """Open a realtime session on the mode's executor."""
        return self.executor.open_session(request)

    async def close(self) -> None:
        """Close the mode's executor."""
        await self.executor.close()


def executor_modes() -> list[str]:
    """The execution modes this worker build can run."""
    return sorted(mode.value for mode in _EXECUTORS)


def _class(module_name: str, class_name: str) -> type:
    cls: type = getattr(importlib.import_module(module_name), class_name)
    return cls


def create_executor(config: WorkerConfig) -> Executor:
    """The executor for `config.mode`, with the family executors its mode hosts in front of it.

    The modules are imported here, not before.
    """
    mode = ExecutionMode(config.mode) if config.mode in EXECUTION_MODES else None
    registered = _EXECUTORS.get(mode) if mode is not None else None
    if mode is None or registered is None:
        raise ValueError(f"unknown execution mode {config.mode!r}; known: {', '.join(executor_modes())}")
    executor: Executor = _class(*registered)(config)
    hosted = [(module, name) for module, name, modes in _FAMILY_EXECUTORS.values() if mode in modes]
    if not hosted:
        return executor
    return FamilyRouter(executor, [_class(module, name)(config, executor) for module, name in hosted])
