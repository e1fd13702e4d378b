"""`ModularPipelines`: diffusers `ModularPipeline`s on the model cache's modules, one `ComponentsManager`.

The model cache loads a model once (`from_pretrained` of its catalog pipeline class, with the
load options: dtype, placement, offload, quantization); its modules are then the components of
one diffusers `ModularPipeline` per task (the family's blocks, pruned to the task's workflow).
Every one of them is registered in the worker's single `ComponentsManager`, in one collection
per loaded model (its cache key), so SDXL's text2image, image2image and inpaint pipelines share
one UNet, VAE and text encoders, and catalog entries on the same source share them too (the
model cache keys loads by source). The manager holds no second copy: the same module objects.
When the model cache drops a model, its collection leaves the manager with it (a finalizer on
the loaded pipeline), so the budget's evictions still free the memory.

Where a family's blocks compute other than its pipeline (diffusers 0.42.1: FLUX.2's system
message, Qwen-Image's image latents, HunyuanVideo 1.5 image-to-video's image embeddings), the
blocks instance built here gets OmniRT's fix for it (`block_fixes.py`), on that instance only.

Each denoising loop block (`LoopSequentialPipelineBlocks`) of a pipeline gets one more sub-block
at the end of its step, `StepHook`: it calls the step callback of the call that runs it (an
attribute of the per-call pipeline copy) for a PROGRESS event and a stop check per step.
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diffusers.modular_pipelines import (
    ComponentsManager,
    LoopSequentialPipelineBlocks,
    ModularPipeline,
    ModularPipelineBlocks,
)

from omnirt import types as t
from omnirt.worker.failures import JobFailure
from omnirt.worker.modes.modular.block_fixes import apply_block_fixes
from omnirt.worker.modes.modular.families import ModularFamily
from omnirt.worker.pipelines.model_cache import CachedPipeline

STEP_CALLBACK = "_omnirt_on_step"
"""Attribute of a per-call pipeline copy: called by `StepHook` after each denoising step."""
HOOK_NAME = "omnirt_step"
GUIDERS = ("guider", "guider_2")
"""Components made from a config that a loaded pipeline may carry (and then the blocks use it)."""

log = logging.getLogger(__name__)

StepCallback = Callable[[Any], None]
"""Called with the loop's block state after each step; raises StopRun to end the loop."""


class StepHook(ModularPipelineBlocks):
    """The last sub-block of a denoising step: the running call's step callback (progress, stop)."""

    model_name = None

    @property
    def description(self) -> str:
        return "OmniRT: a PROGRESS event and a cancel/deadline check after each denoising step"

    def __call__(self, components: Any, block_state: Any, **kwargs: Any) -> tuple[Any, Any]:
        on_step = getattr(components, STEP_CALLBACK, None)
        if on_step is not None:
            on_step(block_state)
        return components, block_state


def add_step_hooks(blocks: Any) -> int:
    """Append a `StepHook` to every denoising loop in `blocks` (and quiet their progress bars)."""
    count = 0
    for block in blocks.sub_blocks.values():
        if isinstance(block, LoopSequentialPipelineBlocks):
            loop: Any = block  # diffusers' stubs lose the attributes its blocks set at run time
            if HOOK_NAME not in loop.sub_blocks:
                loop.sub_blocks[HOOK_NAME] = StepHook()
            loop.set_progress_bar_config(disable=True)
            count += 1
        elif block.sub_blocks:
            count += add_step_hooks(block)
    return count


class _QuietNormalOperation(logging.Filter):
    """Drops diffusers' warnings about what this mode does on purpose, on every call.

    A second task pipeline registers the same modules again ("already exists"), every call makes
    a guider of its own (guiders warn that they are experimental), and a cancelled job ends the
    loop with StopRun, which the blocks log with a traceback before re-raising it.
    """

    QUIET = ("already exists as", "Guiders are currently an experimental feature", "StopRun")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.QUIET)


_FILTER = _QuietNormalOperation()
for _name in (
    "diffusers.modular_pipelines.modular_pipeline",
    "diffusers.modular_pipelines.components_manager",
    "diffusers.guiders.guider_utils",
):
    logging.getLogger(_name).addFilter(_FILTER)


@dataclass
class _Loaded:
    """One loaded model's collection in the manager and its pipelines by task."""

    collection: str
    pipelines: dict[t.Task, ModularPipeline] = field(default_factory=dict)


class ModularPipelines:
    """The worker's `ComponentsManager` and a `ModularPipeline` per (loaded model, task)."""

    def __init__(self) -> None:
        # Re-entrant: a finalizer may run (on a garbage collection) while this thread holds it.
        self._lock = threading.RLock()
        self.manager: Any = ComponentsManager()
        self._loaded: weakref.WeakKeyDictionary[Any, _Loaded] = weakref.WeakKeyDictionary()
        self._numbers = itertools.count(1)

    def pipeline(self, cached: CachedPipeline, family: ModularFamily, task: t.Task) -> ModularPipeline:
        """The modular pipeline of `task` on `cached`'s modules (made on first use, then kept)."""
        with self._lock:
            loaded = self._loaded.get(cached.pipeline)
            if loaded is None:
                # Named by the cache key and numbered: a model evicted and loaded again gets a new
                # collection, so the old one's finalizer (at its garbage collection) never takes
                # the new one's modules with it.
                collection = f"{cached.key.source} ({cached.key.pipeline_class}) #{next(self._numbers)}"
                loaded = self._loaded[cached.pipeline] = _Loaded(collection)
                forget = weakref.finalize(cached.pipeline, self._forget, collection)
                forget.atexit = False  # at exit everything goes anyway
            pipeline = loaded.pipelines.get(task)
            if pipeline is None:
                pipeline = loaded.pipelines[task] = self._build(cached, family, task, loaded.collection)
            return pipeline

    def _build(
        self, cached: CachedPipeline, family: ModularFamily, task: t.Task, collection: str
    ) -> ModularPipeline:
        import diffusers

        blocks = getattr(diffusers, family.blocks)()
        workflow = family.workflows[task]
        if workflow:
            blocks = blocks.get_workflow(workflow)
        # Where these blocks compute other than the family's pipeline, this instance's own fix.
        fixed = apply_block_fixes(family.blocks, blocks)
        if fixed:
            log.debug("%s (%s): OmniRT block fixes %s", family.blocks, workflow or "all", ", ".join(fixed))
        if not add_step_hooks(blocks):
            raise JobFailure("INTERNAL", f"{family.blocks} ({workflow or 'all'}) has no denoising loop")
        pipeline = blocks.init_pipeline(None, components_manager=self.manager, collection=collection)
        base = cached.pipeline
        wanted = set(pipeline.pretrained_component_names)
        # The checkpoint's guiders too (HunyuanVideo 1.5's carries its guidance scale in one).
        taken = wanted | set(GUIDERS)
        modules = {name: c for name, c in base.components.items() if name in taken and c is not None}
        # The loaded pipeline's config (SDXL's force_zeros_for_empty_prompt, ...) as the blocks'.
        configs = {c.name: base.config[c.name] for c in blocks.expected_configs if c.name in base.config}
        pipeline.update_components(**modules, **configs)
        missing = [name for name in pipeline.null_component_names if name in wanted]
        if missing:
            raise JobFailure(
                "FAILED_PRECONDITION",
                f"{type(base).__name__} has no {', '.join(missing)} for the {family.blocks} "
                f"{workflow or task.value} blocks",
                "model",
            )
        pipeline.set_progress_bar_config(disable=True)
        return pipeline

    def _forget(self, collection: str) -> None:
        """The model cache dropped a model: its components leave the manager (and free memory)."""
        with self._lock:
            for component_id in list(self.manager.collections.get(collection, ())):
                self.manager.remove_from_collection(component_id, collection)
            self.manager.collections.pop(collection, None)

    def components(self, name: str = "") -> list[Any]:
        """The components the manager holds (those registered as `name`, when given)."""
        with self._lock:
            return [
                component
                for component_id, component in self.manager.components.items()
                if not name or component_id.rsplit("_", 1)[0] == name
            ]
