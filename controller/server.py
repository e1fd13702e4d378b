"""The controller's gRPC server: public services, the worker gateway, health and reflection.

With `--worker-listen` the worker stream has a port (and grpc server) of its own, so the public
port and the worker port can have different TLS policies (mTLS for workers only).
"""

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

from omnirt._internal.protocol.v1 import gateway_pb2, gateway_pb2_grpc
from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.artifact_store import ArtifactStore
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.edges.audit import AuditLog
from omnirt.controller.edges.auth import Authenticator, AuthInterceptor
from omnirt.controller.edges.interceptors import ErrorInterceptor
from omnirt.controller.edges.servicers import ClusterServicer, GenerationServicer, ModelServicer
from omnirt.controller.edges.shutdown import Shutdown, ShutdownInterceptor
from omnirt.controller.edges.tls import ServerTls
from omnirt.controller.edges.worker_auth import WorkerAdmission
from omnirt.controller.edges.worker_stream import WorkerGateway
from omnirt.controller.engines import make_engine
from omnirt.controller.http.transcode import job_json
from omnirt.controller.observability.tracing import TraceInterceptor
from omnirt.controller.realtime.manager import SessionManager
from omnirt.controller.realtime.registry import RedisSessions
from omnirt.controller.realtime.servicer import RealtimeServicer
from omnirt.controller.webhooks.dispatcher import WebhookDispatcher
from omnirt.v1 import (
    cluster_pb2,
    cluster_pb2_grpc,
    generation_pb2,
    generation_pb2_grpc,
    models_pb2,
    models_pb2_grpc,
    realtime_pb2,
    realtime_pb2_grpc,
)

if TYPE_CHECKING:
    from omnirt.controller.http.app import HttpGateway

log = logging.getLogger("omnirt.controller")

SERVICE_NAMES = (
    generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
    models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
    cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name,
    realtime_pb2.DESCRIPTOR.services_by_name["RealtimeService"].full_name,
    gateway_pb2.DESCRIPTOR.services_by_name["WorkerGatewayService"].full_name,
)


REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"

HEALTH_POLL_S = 0.25
ANSWER_S = 1.0  # at shutdown: for the calls ended UNAVAILABLE to answer their callers
RELEASE_S = 5.0  # at shutdown: for the engine to hand back the jobs of the workers told to reconnect
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


def add_reflection_v1(
    servicer: reflection_pb2_grpc.ServerReflectionServicer, server: grpc.aio.Server
) -> None:
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
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(REFLECTION_V1, {"ServerReflectionInfo": info}),)
    )


class ControllerServer:
    """Owns the engine and the grpc.aio server(s) around it."""

    def __init__(self, config: ControllerConfig, catalog: Catalog | None = None) -> None:
        self.config = config
        self.tls = ServerTls.from_config(config)  # TlsError (a ValueError): unusable flags or files
        self.audit = AuditLog(config.audit_log)
        self.auth = Authenticator(config.auth_keys, self.audit)  # KeyFileError: a bad key file
        self.admission = WorkerAdmission(
            config.worker_token_file, self.audit, client_ca=bool(config.tls_client_ca)
        )
        parts = make_engine(config, catalog or Catalog.load(config.catalog))
        self.engine = parts.client
        # --artifact-store: workers with the same store upload there; objects of evicted jobs
        # go at once on the memory engine (the sweep catches the rest, and the Redis engine's).
        self.artifacts = ArtifactStore(config) if config.artifact_store else None
        if self.artifacts is not None and parts.watch_evictions is not None:
            self.artifacts.track_evictions = True
            parts.watch_evictions(self.artifacts.forget)
        self.webhooks = WebhookDispatcher(  # ValueError: a bad --webhook-* flag
            config, self.engine, deliveries=parts.metrics.webhooks, job_json=job_json, shared=parts.shared
        )
        self._health_task: asyncio.Task[None] | None = None
        shared = RedisSessions(parts.shared.client, parts.shared.prefix) if parts.shared else None
        self.sessions = SessionManager(
            self.engine.catalog, config.session_max_duration_s, name=config.listen, shared=shared
        )
        self.sessions.metrics = parts.metrics.realtime
        # SIGTERM: new calls refused, streams ended, calls in flight given the grace (edges/shutdown).
        self.shutdown = Shutdown()
        self.server = self._grpc_server([AuthInterceptor(self.auth, self.admission.carries_token)])
        public = {
            SERVICE_NAMES[0]: GenerationServicer(
                self.engine, parts.encoded_jobs, self.artifacts, self.webhooks
            ),
            SERVICE_NAMES[1]: ModelServicer(self.engine),
            SERVICE_NAMES[2]: ClusterServicer(self.engine, self.sessions),
            SERVICE_NAMES[3]: RealtimeServicer(self.sessions),
        }
        generation_pb2_grpc.add_GenerationServiceServicer_to_server(public[SERVICE_NAMES[0]], self.server)
        models_pb2_grpc.add_ModelServiceServicer_to_server(public[SERVICE_NAMES[1]], self.server)
        cluster_pb2_grpc.add_ClusterServiceServicer_to_server(public[SERVICE_NAMES[2]], self.server)
        realtime_pb2_grpc.add_RealtimeServiceServicer_to_server(public[SERVICE_NAMES[3]], self.server)
        self.gateway = gateway = WorkerGateway(
            self.engine, self.admission, self.sessions, self.artifacts, parts.arriving_results, self.shutdown
        )
        # One health servicer on both ports: a probe of either sees the same status.
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]  # the stub lacks `aio`
        self.worker_server: grpc.aio.Server | None = None
        if config.worker_listen:
            # The worker stream, and the catalog a worker reads to preload its models.
            self.worker_server = self._grpc_server([AuthInterceptor(self.auth, self.admission.admitted)])
            gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(gateway, self.worker_server)
            models_pb2_grpc.add_ModelServiceServicer_to_server(public[SERVICE_NAMES[1]], self.worker_server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self.worker_server)
        else:
            gateway_pb2_grpc.add_WorkerGatewayServiceServicer_to_server(gateway, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        served = SERVICE_NAMES if not config.worker_listen else SERVICE_NAMES[:4]
        names = (*served, health.SERVICE_NAME, reflection.SERVICE_NAME, REFLECTION_V1)
        reflector = reflection.aio.ReflectionServicer(names)  # type: ignore[attr-defined]  # stub lacks `aio`
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflector, self.server)
        add_reflection_v1(reflector, self.server)
        self.port = self._bind(self.server, config.listen, self._public_credentials())
        self.worker_port = 0
        if self.worker_server is not None:
            worker_creds = (
                self.tls.grpc_credentials(require_client_auth=bool(config.tls_client_ca))
                if self.tls
                else None
            )
            self.worker_port = self._bind(self.worker_server, config.worker_listen, worker_creds)
        # The HTTP gateway calls the same servicers, so HTTP and gRPC share every code path.
        self.http: HttpGateway | None = None
        if config.http:
            from omnirt.controller.http.app import HttpGateway

            ssl_context = (
                self.tls.ssl_context(require_client_auth=config.tls_public_client_auth) if self.tls else None
            )
            self.http = HttpGateway(
                self.engine,
                parts.metrics,
                public,
                config.http,
                config.http_max_body_bytes,
                auth=self.auth,
                ssl_context=ssl_context,
                cors_origins=config.cors_origin,
                metrics_auth=config.metrics_auth,
                artifacts=self.artifacts,
                shutdown=self.shutdown,
            )

    def _grpc_server(self, interceptors: list[grpc.aio.ServerInterceptor]) -> grpc.aio.Server:
        limit = self.config.max_message_bytes
        return grpc.aio.server(
            interceptors=[
                TraceInterceptor(),
                ErrorInterceptor(),
                ShutdownInterceptor(self.shutdown),
                *interceptors,
            ],
            options=[
                ("grpc.max_send_message_length", limit),
                ("grpc.max_receive_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )

    def _public_credentials(self) -> grpc.ServerCredentials | None:
        """The public port's TLS: client certificates required on it only when asked for.

        grpc Python can only require client certificates on a port or not ask for them, so
        without a worker port of its own, mTLS for workers means mTLS for every caller."""
        config = self.config
        if self.tls is None:
            return None
        require = config.tls_public_client_auth or (bool(config.tls_client_ca) and not config.worker_listen)
        if require and not config.tls_public_client_auth:
            log.warning(
                "--tls-client-ca without --worker-listen: client certificates are required on %s for "
                "every caller, not only workers (grpc asks for them per port; give workers a port of "
                "their own with --worker-listen to keep the public API on plain TLS)",
                config.listen,
            )
        return self.tls.grpc_credentials(require_client_auth=require)

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
        check_bindable(address)
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError:
            port = 0
        if port == 0:
            raise ListenError(f"cannot listen on {address}")
        return port

    def reload(self) -> None:
        """SIGHUP: read the key file, the worker token file and the TLS files again.

        A bad file keeps what is in force; open streams are not dropped (TLS: new handshakes
        use the new certificate, connections made before keep theirs)."""
        self.auth.reload()
        self.admission.reload()
        if self.tls is not None:
            self.tls.reload()

    async def start(self) -> None:
        # grpc's health servicer says SERVING for "" until told otherwise: not before the HTTP
        # gateway listens too (a probe, or a test, would find that port closed).
        await self._set_health(False)
        await self.engine.start()
        await self.webhooks.start()
        if self.artifacts is not None:
            self.artifacts.start()
        await self.server.start()
        if self.worker_server is not None:
            await self.worker_server.start()
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
            "controller listening on %s%s (%d models in the catalog)",
            self.address,
            " over TLS" if self.tls else "",
            len(self.engine.catalog),
        )
        if self.worker_server is not None:
            log.info("worker stream on %s", self.worker_address)

    @property
    def address(self) -> str:
        host = self.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    @property
    def worker_address(self) -> str:
        """The worker stream's own HOST:PORT with --worker-listen, else "" (it is on `address`)."""
        if not self.worker_port:
            return ""
        host = self.config.worker_listen.rsplit(":", 1)[0]
        return f"{host}:{self.worker_port}"

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

    async def stop(self, grace_s: float | None = None) -> None:
        """Shut down gracefully (docs/operations.md, "Rolling upgrades"): NOT_SERVING, new calls
        refused and open streams ended (edges/shutdown), unary calls in flight given up to
        `grace_s` (default --shutdown-grace-s) to finish, those still running ended UNAVAILABLE,
        the workers told to reconnect (their jobs handed back first), then everything stopped."""
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        self.shutdown.close()
        if self._health_task is not None:
            self._health_task.cancel()
        await self.health.enter_graceful_shutdown()
        if not await self.shutdown.calls_done(grace_s):
            log.warning(
                "shutdown: the grace of %g s ran out; the calls still running end UNAVAILABLE", grace_s
            )
        self.shutdown.expire()
        await self.shutdown.calls_done(ANSWER_S)  # the ended calls answer their callers
        await self.gateway.release_workers(RELEASE_S)
        if self.http is not None:
            await self.http.stop()
        await self.webhooks.stop()
        await self.engine.stop()
        if self.artifacts is not None:
            await self.artifacts.stop()
        servers = [self.server] if self.worker_server is None else [self.server, self.worker_server]
        await asyncio.gather(*(server.stop(ANSWER_S) for server in servers))
