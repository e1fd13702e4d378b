"""The controller's gRPC server: public services, the worker gateway, health and reflection."""

from __future__ import annotations

import logging

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from omnirt.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
)
from omnirt.worker.v1 import gateway_pb2, gateway_pb2_grpc

from .catalog import Catalog
from .config import ControllerConfig
from .engine import Engine
from .gateway import WorkerGateway
from .interceptors import ErrorInterceptor
from .servicers import ClusterServicer, GenerationServicer, ModelServicer

log = logging.getLogger("omnirt.controller")

SERVICE_NAMES = (
    generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
    models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    gateway_pb2.DESCRIPTOR.services_by_name["WorkerGatewayService"].full_name,
)


class ControllerServer:
    """Owns the engine and the grpc.aio server around it."""

    def __init__(self, config: ControllerConfig, catalog: Catalog | None = None) -> None:
        self.config = config
        self.engine = Engine(config, catalog or Catalog.load(config.catalog))
        limit = config.max_message_bytes
        self.server = grpc.aio.server(
            interceptors=[ErrorInterceptor()],
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        generation_pb2_grpc.add_GenerationServiceServicer_to_server(
            GenerationServicer(self.engine), self.server
        )
        models_pb2_grpc.add_ModelServiceServicer_to_server(ModelServicer(self.engine), self.server)
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(ClusterServicer(self.engine), self.server)
        gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(WorkerGateway(self.engine), self.server)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = self.server.add_insecure_port(config.listen)
        if self.port == 0:
            raise OSError(f"cannot listen on {config.listen}")

    async def start(self) -> None:
        await self.engine.start()
        await self.server.start()
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "controller listening on %s (%d models in the catalog)", self.address, len(self.engine.catalog)
        )

    @property
    def address(self) -> str:
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING, let calls in flight finish for up to `grace_s`, then stop."""
        await self.health.enter_graceful_shutdown()
        await self.engine.stop()
        await self.server.stop(grace_s)
