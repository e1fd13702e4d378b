"""The controller's gRPC server: public services, the worker gateway, health and reflection."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import TYPE_CHECKING

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

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
from .edges.audit import AuditLog
from .edges.auth import Authenticator
from .edges.auth_interceptor import AuthInterceptor
from .engine_client import EngineClient, MemoryEngineClient
from .gateway import WorkerGateway
from .interceptors import ErrorInterceptor
from .servicers import ClusterServicer, GenerationServicer, ModelServicer
from .tracing import TraceInterceptor

if TYPE_CHECKING:
    from .http import HttpGateway

log = logging.getLogger("omnirt.controller")

SERVICE_NAMES = (
    generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
    models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    gateway_pb2.DESCRIPTOR.services_by_name["WorkerGatewayService"].full_name,
)


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"

HEALTH_POLL_S = 0.25
LIVENESS_SERVICE = "omnirt.liveness"


class ListenError(Exception):
    """A listen address (gRPC or HTTP) cannot be bound; the message is one line for the user."""


def listen_error(address: str, exc: OSError) -> ListenError:
    reason = "address in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc)).lower()
    return ListenError(f"cannot listen on {address}: {reason}")


def check_bindable(address: str) -> None:
    """Raise ListenError when the port of `address` is taken.

    grpc's own bind failure is a RuntimeError that names no cause, after a line of its C core
    on stderr; a plain socket finds out first and says why."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return  # port 0 always binds; a malformed address is left to grpc's own error
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError:
        return
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc and aiohttp bind
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                # Only a taken port: grpc binds what it can of the rest (no IPv6 for localhost).
                if exc.errno == errno.EADDRINUSE:
                    raise listen_error(address, exc) from None


def add_reflection_v1(servicer: object, server: grpc.aio.Server) -> None:
    """Serve `servicer` (grpcio-reflection's v1alpha one) as grpc.reflection.v1 too.

    grpcurl and newer clients ask for v1; grpcio-reflection ships v1alpha only. The two protos
    differ in the package name alone, so the same messages answer v1 on the wire, and a copy of
    the v1alpha file under the v1 name lets reflection describe the v1 service as well."""
    pool = descriptor_pool.Default()
    try:
        pool.FindServiceByName(REFLECTION_V1)
    except KeyError:
        file = descriptor_pb2.FileDescriptorProto()
        reflection_pb2.DESCRIPTOR.CopyToProto(file)
        file.name = "grpc/reflection/v1/reflection.proto"
        file.package = "grpc.reflection.v1"
        for msg in file.message_type:
            for fld in msg.field:
                if fld.type_name:
                    fld.type_name = fld.type_name.replace(".v1alpha.", ".v1.")
        for method in file.service[0].method:
            method.input_type = method.input_type.replace(".v1alpha.", ".v1.")
            method.output_type = method.output_type.replace(".v1alpha.", ".v1.")
        pool.Add(file)
    info = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,  # type: ignore[attr-defined]
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": info}),)
    )


def make_engine(config: ControllerConfig, catalog: Catalog) -> EngineClient:
    """The engine `config.store` asks for: in memory (default) or on Redis."""
    if config.store in ("", "memory"):
        return MemoryEngineClient(Engine(config, catalog))
    if config.store.startswith(("redis://", "rediss://", "unix://")):
        from .redis_engine import RedisEngine

        return RedisEngine(config, catalog)
    raise ValueError(f"--store: expected memory or redis://HOST:PORT/DB, got {config.store!r}")


class ControllerServer:
    """Owns the engine and the grpc.aio server around it."""

    def __init__(self, config: ControllerConfig, catalog: Catalog | None = None) -> None:
        self.config = config
        self.audit = AuditLog(config.audit_log)
        self.auth = Authenticator(config.auth_keys, self.audit)  # KeyFileError: a bad key file
        self.engine = make_engine(config, catalog or Catalog.load(config.catalog))
        self._health_task: asyncio.Task[None] | None = None
        limit = config.max_message_bytes
        self.server = grpc.aio.server(
            interceptors=[TraceInterceptor(), ErrorInterceptor(), AuthInterceptor(self.auth)],
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        public = {
            SERVICE_NAMES[0]: GenerationServicer(self.engine),
            SERVICE_NAMES[1]: ModelServicer(self.engine),
            SERVICE_NAMES[2]: ClusterServicer(self.engine),
        }
        generation_pb2_grpc.add_GenerationServiceServicer_to_server(public[SERVICE_NAMES[0]], self.server)
        models_pb2_grpc.add_ModelServiceServicer_to_server(public[SERVICE_NAMES[1]], self.server)
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(public[SERVICE_NAMES[2]], self.server)
        gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(WorkerGateway(self.engine), self.server)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
        reflector = reflection.aio.ReflectionServicer(names)  # type: ignore[attr-defined]
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflector, self.server)
        add_reflection_v1(reflector, self.server)
        check_bindable(config.listen)
        try:
            self.port = self.server.add_insecure_port(config.listen)
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise ListenError(f"cannot listen on {config.listen}")
        # The HTTP gateway calls the same servicers, so HTTP and gRPC share every code path.
        self.http: HttpGateway | None = None
        if config.http:
            from .http import HttpGateway

            self.http = HttpGateway(self.engine, public, config.http, config.http_max_body_bytes)

    def reload(self) -> None:
        """SIGHUP: read the key file again (a bad one keeps the keys in force)."""
        self.auth.reload()

    async def start(self) -> None:
        await self.engine.start()
        await self.server.start()
        if self.http is not None:
            try:
                await self.http.start()
            except OSError as exc:
                # Stopped here, not left to the garbage collector after the loop has closed.
                await self.stop(0)
                raise listen_error(self.config.http, exc) from None
        await self._set_health(self.engine.ready())
        # For liveness probes: SERVING until shutdown, also while the job store is unreachable.
        await self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._health_task = asyncio.create_task(self._watch_health())
        log.info(
            "controller listening on %s (%d models in the catalog)", self.address, len(self.engine.catalog)
        )

    @property
    def address(self) -> str:
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def _set_health(self, ready: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICE_NAMES):
            await self.health.set(name, status)

    async def _watch_health(self) -> None:
        """NOT_SERVING while the job store is unreachable, SERVING again when it is back."""
        ready = self.engine.ready()
        while True:
            await asyncio.sleep(HEALTH_POLL_S)
            now = self.engine.ready()
            if now != ready:
                ready = now
                log.warning("job store %s: health %s", "reachable" if now else "unreachable", now)
                await self._set_health(now)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING, let calls in flight finish for up to `grace_s`, then stop."""
        if self._health_task is not None:
            self._health_task.cancel()
        await self.health.enter_graceful_shutdown()
        if self.http is not None:
            await self.http.stop()
        await self.engine.stop()
        await self.server.stop(grace_s)
