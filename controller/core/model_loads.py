"""`ModelLoads`: ModelService.LoadModel / UnloadModel over the workers connected to this controller.

A load picks the workers that can serve the model (execution mode, `--models`, not draining),
counts those warm already as done, sends the others a `LoadModel` and waits for their answers;
an unload sends `UnloadModel` and waits the same way. Each request is answered by its worker
with its request id; a worker lost before it answers gets an UNAVAILABLE outcome, and one that
has not answered when the wait ends (the call's deadline) a DEADLINE_EXCEEDED one, while it
goes on (a load still makes the model warm; an unload gives up at that deadline on the worker
too). Both engines use it the same way: only the workers connected to *this* controller are
reached (on Redis, a worker connected to another controller is not).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from omnirt._internal.protocol.messages import ControllerMessage, LoadModel, ModelLoaded, UnloadModel
from omnirt.controller.core.bounds import check_id
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.router import WorkerHandle, WorkerRegistry
from omnirt.errors import FailedPrecondition, InvalidRequest, Unavailable, WorkerNotFound
from omnirt.types import JobError, ModelOutcome, ModelSpec, WorkerState

log = logging.getLogger("omnirt.controller.model_loads")

# The most worker ids one request may name (a cluster of this many workers is far off).
MAX_WORKER_IDS = 1024
# Without a call deadline a load or unload waits at most this long for its workers.
DEFAULT_WAIT_S = 600.0


@dataclass
class _Pending:
    worker_id: str
    loading: bool
    future: asyncio.Future[ModelOutcome] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ModelLoads:
    """Sends LoadModel / UnloadModel to workers and matches their answers (one per engine)."""

    def __init__(self, workers: WorkerRegistry, catalog: Catalog) -> None:
        self.workers = workers
        self.catalog = catalog
        self._pending: dict[str, _Pending] = {}

    # ---- the two operations --------------------------------------------------------------

    async def load(
        self, name: str, count: int, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        """Make model `name` warm on `count` workers (0: every one that can serve it), of
        `worker_ids` when given; one outcome per chosen worker, in worker id order.

        ModelNotFound for an unknown model, WorkerNotFound for an id not connected here,
        FailedPrecondition (field `model` or `worker_ids`) when none (or a named one) can serve
        it, Unavailable when no worker is connected at all, InvalidRequest (`workers`) when
        `count` is more than can serve it.
        """
        spec = self._spec(name)
        pool = self._eligible(spec, self._named(worker_ids))
        if count > len(pool):
            raise InvalidRequest(
                f"workers: {count} asked, but {len(pool)} connected worker(s) can serve model {spec.id!r}"
                f" ({', '.join(w.id for w in pool)})",
                field="workers",
            )
        warm = [w for w in pool if spec.id in w.info.loaded_models]
        cold = sorted(
            (w for w in pool if spec.id not in w.info.loaded_models),
            key=lambda w: (w.busy_slots / max(1, w.info.slots), w.id),
        )
        if count:
            warm = warm[:count]
            cold = cold[: count - len(warm)]
        outcomes = [
            ModelOutcome(w.id, loaded=True, memory_bytes=w.model_bytes.get(spec.id, 0), unchanged=True)
            for w in warm
        ]
        sent = {w.id: self._send(w, True, lambda rid: LoadModel(rid, spec)) for w in cold}
        if sent:
            log.info("loading model %s on %s", spec.id, ", ".join(sent))
        outcomes += await self._answers(
            sent, _wait(wait_s), "still loading (it goes on and the model becomes warm)"
        )
        return spec, sorted(outcomes, key=lambda o: o.worker_id)

    async def unload(
        self, name: str, worker_ids: list[str], wait_s: float | None
    ) -> tuple[ModelSpec, list[ModelOutcome]]:
        """Free model `name` on `worker_ids` (empty: every connected worker that serves it),
        each once no job of it runs there; one outcome per worker, in worker id order."""
        spec = self._spec(name)
        named = self._named(worker_ids)
        targets = named if named is not None else [w for w in self.workers.all() if w.serves(spec)]
        wait = _wait(wait_s)
        deadline_ms = int((time.time() + wait) * 1000)
        outcomes: list[ModelOutcome] = []
        sent: dict[str, _Pending] = {}
        for w in targets:
            if not w.loads_models:
                outcomes.append(_too_old(w, spec))
            else:
                sent[w.id] = self._send(w, False, lambda rid: UnloadModel(rid, spec.id, deadline_ms))
        if sent:
            log.info("unloading model %s on %s", spec.id, ", ".join(sent))
        outcomes += await self._answers(sent, wait, "jobs of the model still run there; it stays loaded")
        return spec, sorted(outcomes, key=lambda o: o.worker_id)

    # ---- the worker side -----------------------------------------------------------------

    def answered(self, handle: WorkerHandle, answer: ModelLoaded) -> None:
        """A worker's ModelLoaded; an answer to a request this controller no longer waits for is ignored."""
        pending = self._pending.get(answer.request_id)
        if pending is None or pending.worker_id != handle.id or pending.future.done():
            return
        loaded = answer.ok if pending.loading else not answer.ok
        if answer.ok:  # seen now, before its next heartbeat says so
            models = [m for m in handle.info.loaded_models if m != answer.model_id]
            if loaded:
                models.append(answer.model_id)
                handle.model_bytes[answer.model_id] = answer.memory_bytes
            else:
                handle.model_bytes.pop(answer.model_id, None)
            handle.info.loaded_models = sorted(models)
        outcome = ModelOutcome(
            handle.id,
            loaded=loaded,
            error=None if answer.ok else answer.error or JobError("UNKNOWN", "the worker gave no reason"),
            load_ms=answer.load_ms,
            memory_bytes=answer.memory_bytes if loaded else 0,
            unchanged=answer.unchanged,
        )
        pending.future.set_result(outcome)

    def worker_lost(self, handle: WorkerHandle) -> None:
        """`handle`'s worker is gone: what it has not answered ends UNAVAILABLE."""
        for pending in self._pending.values():
            if pending.worker_id == handle.id and not pending.future.done():
                error = JobError("UNAVAILABLE", f"worker {handle.id} was lost before it answered")
                pending.future.set_result(ModelOutcome(handle.id, error=error))

    def warm_on(self, spec: ModelSpec) -> dict[str, int]:
        """Connected workers holding `spec` loaded (their last heartbeat) -> its bytes there."""
        return {
            w.id: w.model_bytes.get(spec.id, 0) for w in self.workers.all() if spec.id in w.info.loaded_models
        }

    # ---- internals -----------------------------------------------------------------------

    def _spec(self, name: str) -> ModelSpec:
        check_id("model", name)
        if not name:
            raise InvalidRequest("model: required", field="model")
        return self.catalog.resolve(name)  # ModelNotFound

    def _named(self, worker_ids: list[str]) -> list[WorkerHandle] | None:
        """The connected workers `worker_ids` names (None when it names none); WorkerNotFound."""
        if not worker_ids:
            return None
        if len(worker_ids) > MAX_WORKER_IDS:
            raise InvalidRequest(
                f"worker_ids: {len(worker_ids)} ids, at most {MAX_WORKER_IDS}", field="worker_ids"
            )
        for worker_id in worker_ids:
            check_id("worker_ids", worker_id)
        named = []
        for worker_id in sorted(set(worker_ids)):
            try:
                named.append(self.workers.get(worker_id))
            except WorkerNotFound as exc:
                raise WorkerNotFound(f"worker_ids: {exc.message}", field="worker_ids") from None
        return named

    def _eligible(self, spec: ModelSpec, named: list[WorkerHandle] | None) -> list[WorkerHandle]:
        """The workers a load may use: all of `named`, or every eligible one; refusals say why."""
        if named is not None:
            for w in named:
                why = _why_not(w, spec)
                if why:
                    raise FailedPrecondition(f"worker_ids: {why}", field="worker_ids")
            return named
        connected = self.workers.all()
        if not connected:
            raise Unavailable(f"model: no worker is connected to this controller to load model {spec.id!r}")
        pool = [w for w in connected if not _why_not(w, spec)]
        if not pool:
            reasons = "; ".join(_why_not(w, spec) for w in connected[:8])
            more = f"; and {len(connected) - 8} more" if len(connected) > 8 else ""
            raise FailedPrecondition(
                f"model: no connected worker can load model {spec.id!r} "
                f"(execution mode {spec.execution_mode!r}): {reasons}{more}",
                field="model",
            )
        return pool

    def _send(
        self, handle: WorkerHandle, loading: bool, make: Callable[[str], ControllerMessage]
    ) -> _Pending:
        request_id = uuid.uuid4().hex
        pending = _Pending(handle.id, loading)
        self._pending[request_id] = pending
        handle.link.send(make(request_id))
        return pending

    async def _answers(self, sent: dict[str, _Pending], wait_s: float, late: str) -> list[ModelOutcome]:
        if not sent:
            return []
        futures = [p.future for p in sent.values()]
        try:
            await asyncio.wait(futures, timeout=wait_s)
        finally:
            for request_id in [rid for rid, p in self._pending.items() if p in sent.values()]:
                del self._pending[request_id]
        outcomes = []
        for worker_id, pending in sent.items():
            if pending.future.done():
                outcomes.append(pending.future.result())
            else:
                pending.future.cancel()
                error = JobError("DEADLINE_EXCEEDED", f"worker {worker_id} did not answer in time: {late}")
                outcomes.append(ModelOutcome(worker_id, error=error))
        return outcomes


def _why_not(w: WorkerHandle, spec: ModelSpec) -> str:
    """Why worker `w` cannot load `spec` now ("" when it can)."""
    if w.info.execution_mode != spec.execution_mode:
        return f"worker {w.id!r} runs execution mode {w.info.execution_mode!r}"
    if w.info.models and spec.id not in w.info.models:
        return (
            f"worker {w.id!r} does not serve model {spec.id!r} (its --models: {', '.join(w.info.models[:8])})"
        )
    if w.info.state is not WorkerState.READY:
        return f"worker {w.id!r} is {w.info.state.value}"
    if not w.loads_models:
        return f"worker {w.id!r} is too old to load models on request (upgrade it)"
    return ""


def _too_old(w: WorkerHandle, spec: ModelSpec) -> ModelOutcome:
    error = JobError("FAILED_PRECONDITION", f"worker {w.id} is too old to unload models on request")
    return ModelOutcome(w.id, loaded=spec.id in w.info.loaded_models, error=error)


def _wait(wait_s: float | None) -> float:
    """How long to wait for the workers: the call's time left, less a margin to answer in."""
    if wait_s is None:
        return DEFAULT_WAIT_S
    return max(0.0, min(DEFAULT_WAIT_S, wait_s - 0.5 if wait_s > 1.0 else wait_s * 0.5))
