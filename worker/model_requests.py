"""`ModelRequests`: the controller's LoadModel and UnloadModel (ModelService, admin) on a worker.

A load goes through the executor's `preload` (the same load a job does: the model cache, or a
persistent group); a mode without one answers the refusal. An unload waits until no job of the
model runs here (jobs that arrive meanwhile run too and keep it), then has the executor free
it; past the request's deadline it gives up and answers DEADLINE_EXCEEDED, the model kept.
Unloading is no ban: a later job of the model loads it again. Every answer goes out right
after a heartbeat, so the controller's `loaded_models` is fresh when its call returns.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from omnirt import types as t
from omnirt._internal.protocol.messages import LoadModel, ModelLoaded, UnloadModel
from omnirt.worker import redact
from omnirt.worker.failures import ModelInUse
from omnirt.worker.modes.executor import Executor

log = logging.getLogger(__name__)

# How often an unload blocked by a session (no job to wait for) looks again.
IN_USE_POLL_S = 0.2


class ModelRequests:
    """Runs LoadModel / UnloadModel requests as tasks and answers each one.

    `running_of(model_id)`: the tasks running jobs of the model now; `refusal(spec)`: why this
    worker does not serve a model (or None); `send` queues a message for the controller and
    `heartbeat` queues a heartbeat.
    """

    def __init__(
        self,
        executor: Callable[[], Executor],
        running_of: Callable[[str], list[asyncio.Task[None]]],
        refusal: Callable[[t.ModelSpec], t.JobError | None],
        send: Callable[[ModelLoaded], None],
        heartbeat: Callable[[], None],
        model_dir: str,
    ) -> None:
        self._executor = executor
        self._running_of = running_of
        self._refusal = refusal
        self._send = send
        self._heartbeat = heartbeat
        self._model_dir = model_dir
        self._tasks: set[asyncio.Task[None]] = set()

    def handle(self, request: LoadModel | UnloadModel, draining: bool) -> None:
        """Start working on `request` (answered when done)."""
        if draining and isinstance(request, LoadModel):
            self._answer(
                request.request_id, request.model.id, t.JobError("UNAVAILABLE", "the worker is draining")
            )
            return
        work = self._load(request) if isinstance(request, LoadModel) else self._unload(request)
        task = asyncio.create_task(work, name=f"omnirt-model-{request.request_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        """Stop what is still waiting (the worker shuts down)."""
        for task in list(self._tasks):
            task.cancel()

    async def _load(self, request: LoadModel) -> None:
        spec = request.model
        refusal = self._refusal(spec)
        if refusal is not None:
            self._answer(request.request_id, spec.id, t.JobError(refusal.code, refusal.message, "model"))
            return
        executor = self._executor()
        if spec.id in executor.loaded_models():
            self._answer(request.request_id, spec.id, memory=self._memory(spec.id), unchanged=True)
            return
        started = time.monotonic()
        log.info("loading model %s (asked by the controller)", spec.id)
        try:
            await executor.preload(spec)
        except NotImplementedError as exc:
            self._answer(request.request_id, spec.id, t.JobError("FAILED_PRECONDITION", str(exc), "model"))
            return
        except Exception as exc:  # the reason, without this worker's folders
            log.error("load of model %s failed: %s: %s", spec.id, type(exc).__name__, exc)
            error = t.JobError("FAILED_PRECONDITION", f"{exc}" or type(exc).__name__, "model")
            self._answer(request.request_id, spec.id, self._public(error, spec))
            return
        load_ms = (time.monotonic() - started) * 1000.0
        log.info("model %s loaded in %.0f ms", spec.id, load_ms)
        self._answer(request.request_id, spec.id, load_ms=load_ms, memory=self._memory(spec.id))

    async def _unload(self, request: UnloadModel) -> None:
        model_id = request.model_id
        executor = self._executor()
        while True:
            running = self._running_of(model_id)
            if not running:
                try:
                    held = await executor.unload(model_id)
                except NotImplementedError as exc:
                    self._answer(request.request_id, model_id, t.JobError("FAILED_PRECONDITION", str(exc)))
                    return
                except ModelInUse as exc:
                    blocked = str(exc)
                else:
                    log.info(
                        "model %s %s (asked by the controller)", model_id, "unloaded" if held else "not held"
                    )
                    self._answer(request.request_id, model_id, unchanged=not held)
                    return
            else:
                blocked = f"{len(running)} job(s) of model {model_id!r} still run here"
            remaining = request.deadline_ms / 1000.0 - time.time() if request.deadline_ms else None
            if remaining is not None and remaining <= 0:
                error = t.JobError("DEADLINE_EXCEEDED", f"{blocked}; the model stays loaded")
                self._answer(request.request_id, model_id, error)
                return
            if running:
                await asyncio.wait(running, timeout=remaining)
            else:
                await asyncio.sleep(min(IN_USE_POLL_S, remaining) if remaining is not None else IN_USE_POLL_S)

    def _memory(self, model_id: str) -> int:
        return self._executor().model_memory().get(model_id, 0)

    def _public(self, error: t.JobError, spec: t.ModelSpec) -> t.JobError:
        return redact.public_error(error, {self._model_dir: "MODEL_DIR"}, keep=[spec.source])

    def _answer(
        self,
        request_id: str,
        model_id: str,
        error: t.JobError | None = None,
        *,
        load_ms: float = 0.0,
        memory: int = 0,
        unchanged: bool = False,
    ) -> None:
        self._heartbeat()  # first: the controller reads it before the answer
        answer = ModelLoaded(
            request_id,
            model_id,
            error is None,
            error,
            load_ms=load_ms,
            memory_bytes=memory,
            unchanged=unchanged,
        )
        self._send(answer)
