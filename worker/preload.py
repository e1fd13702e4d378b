"""`Preload`: the worker's `--models` made warm at start, before their first job.

Preload (`--preload`, on by default for persistent_worker): after the first Welcome the worker
asks the controller's ModelService (DescribeModel, over the stream's channel) for the catalog
entry of each of its `--models` and has the executor make it warm, in the background: jobs
are taken meanwhile (a job for a model still loading waits for it and is reported cold), and
`loaded_models` names a model only once it is warm. A model the controller could not describe
(the controller away) is asked for again after the next Welcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from omnirt import types as t
from omnirt._internal import catalog_convert
from omnirt.v1 import models_pb2, models_pb2_grpc
from omnirt.worker.config import WorkerConfig
from omnirt.worker.connection import REFUSALS
from omnirt.worker.credentials import WorkerCredentials
from omnirt.worker.modes.executor import Executor

log = logging.getLogger(__name__)

DESCRIBE_TIMEOUT_S = 10.0


class Preload:
    """Describes and preloads the `--models`; each model once, until it is settled.

    `executor` gives the worker's executor; `heartbeat` queues a heartbeat (the controller
    learns a model is warm at once, not a beat later).
    """

    def __init__(
        self,
        config: WorkerConfig,
        credentials: WorkerCredentials,
        executor: Callable[[], Executor],
        heartbeat: Callable[[], None],
    ) -> None:
        self._config = config
        self._credentials = credentials
        self._executor = executor
        self._heartbeat = heartbeat
        # Preloads by model id: a task while the model is made warm, None once settled.
        self._preloads: dict[str, asyncio.Task[None] | None] = {}

    def start(self, channel: grpc.aio.Channel) -> asyncio.Task[None] | None:
        """Preload the `--models` not preloaded yet (after each Welcome until all are settled);
        the task describing them, to be cancelled when `channel`'s stream ends."""
        if not self._config.preload:
            return None
        pending = [m for m in self._config.models if m not in self._preloads]
        if not pending:
            return None
        return asyncio.create_task(self._describe_and_preload(channel, pending), name="omnirt-preload")

    def loading(self, model_id: str) -> asyncio.Task[None] | None:
        """The task making `model_id` warm now, if any."""
        return self._preloads.get(model_id)

    def cancel(self) -> None:
        """Stop the loads still running (the worker shuts down)."""
        for task in self._preloads.values():
            if task is not None:
                task.cancel()

    async def _describe_and_preload(self, channel: grpc.aio.Channel, model_ids: list[str]) -> None:
        stub = models_pb2_grpc.ModelServiceStub(channel)
        for model_id in model_ids:
            request = models_pb2.DescribeModelRequest(model=model_id)
            try:
                # With the worker's token: a controller with API keys lets an admitted worker
                # read its catalog (controller/edges/auth.py, CATALOG_SERVICE).
                response = await stub.DescribeModel(
                    request, timeout=DESCRIBE_TIMEOUT_S, metadata=self._credentials.metadata()
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                    log.warning("preload: the controller has no model %r (%s)", model_id, exc.details())
                    self._preloads[model_id] = None
                elif exc.code() in REFUSALS:
                    # The catalog refuses this worker (no token: admitted by certificate, or an
                    # older controller): the model loads at its first job instead (asked again at
                    # each session, it would fail the same way and fill the audit log).
                    log.warning(
                        "preload: the controller does not describe model %r to this worker (%s); "
                        "it loads at its first job",
                        model_id,
                        exc.code().name,
                    )
                    self._preloads[model_id] = None
                else:  # the controller is away: the next session asks again
                    log.warning("preload: cannot describe model %r: %s", model_id, exc.code().name)
                continue
            spec = catalog_convert.model_from_proto(response.model)
            if spec.execution_mode and spec.execution_mode != self._config.mode:
                log.warning(
                    "preload: model %r runs in mode %r, not %r; not preloaded",
                    model_id,
                    spec.execution_mode,
                    self._config.mode,
                )
                self._preloads[model_id] = None
                continue
            self._preloads[model_id] = asyncio.create_task(
                self._preload(spec), name=f"omnirt-preload-{model_id}"
            )

    async def _preload(self, spec: t.ModelSpec) -> None:
        started = time.monotonic()
        log.info("preloading model %s", spec.id)
        try:
            await self._executor().preload(spec)
        except NotImplementedError as exc:
            log.warning("--preload: %s", exc)
        except Exception as exc:  # its first job tries again (and reports why it cannot)
            log.error("preload of model %s failed: %s: %s", spec.id, type(exc).__name__, exc)
        else:
            log.info("model %s preloaded in %.1f s", spec.id, time.monotonic() - started)
            self._heartbeat()  # the controller learns it is warm now, not a beat later
        finally:
            self._preloads[spec.id] = None
