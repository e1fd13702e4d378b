"""The gRPC side of auth: every method of the public services runs as an authenticated caller.

Which methods need what is decided by service, from the descriptors, so a new RPC cannot be
left open by mistake: every method of `GenerationService`, `ModelService` and
`RealtimeService` needs a key, every method of `ClusterService` (and any later management
service named in `ADMIN_SERVICES`) an admin key, and so do the management methods of a user
service named in `ADMIN_METHODS` (ModelService's LoadModel and UnloadModel: they change what
the workers hold; an admitted worker's token, which may read the catalog, may not call them).
Health and reflection stay open (probes, grpcurl: they show nothing of anyone's jobs), and the
worker stream is admitted by its own token (`worker_auth.py`).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

import grpc

from omnirt.controller.edges.auth import CURRENT, Authenticator, Principal
from omnirt.controller.edges.interceptors import WrappingInterceptor
from omnirt.v1 import cluster_pb2, generation_pb2, models_pb2, realtime_pb2

USER_SERVICES = frozenset(
    {
        generation_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
        models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
        realtime_pb2.DESCRIPTOR.services_by_name["RealtimeService"].full_name,
    }
)
ADMIN_SERVICES = frozenset({cluster_pb2.DESCRIPTOR.services_by_name["ClusterService"].full_name})
_MODEL_SERVICE = models_pb2.DESCRIPTOR.services_by_name["ModelService"]
# Full method names (`/package.Service/Method`) of user services that need an admin key; from
# the descriptors, so a renamed method fails at import instead of falling back to "user".
ADMIN_METHODS = frozenset(
    f"/{_MODEL_SERVICE.full_name}/{_MODEL_SERVICE.methods_by_name[name].name}"
    for name in ("LoadModel", "UnloadModel")
)
# The catalog, which workers read too (a worker preloads a model with DescribeModel): an
# admitted worker's token may read it. It holds no tenant's data.
CATALOG_SERVICE = models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name
WORKER = Principal(tenant="", role="worker", key_name="worker token")
# (metadata, auth context) -> whether the caller is an admitted worker
WorkerCheck = Callable[[Iterable[tuple[str, Any]], Mapping[str, Iterable[bytes]]], bool]


def needs(method: str) -> str:
    """'admin', 'user' or '' (open) for a full method name `/package.Service/Method`."""
    service = method.lstrip("/").rpartition("/")[0]
    if service in ADMIN_SERVICES or method in ADMIN_METHODS:
        return "admin"
    if service in USER_SERVICES:
        return "user"
    return ""


class AuthInterceptor(WrappingInterceptor):
    """Authenticates each call of the public services and runs it with `CURRENT` set.

    Place it after the ErrorInterceptor: its refusals are OmniRTErrors that the ErrorInterceptor
    turns into UNAUTHENTICATED / PERMISSION_DENIED with the standard details."""

    def __init__(self, authenticator: Authenticator, worker: WorkerCheck | None = None) -> None:
        super().__init__()
        self.auth = authenticator
        # Is this call from an admitted worker (its token; on the worker port, its certificate)?
        # Such a call may read the catalog.
        self.worker = worker

    def wrap(self, method: str, fn: Callable[..., Any], request_streaming: bool) -> Callable[..., Any] | None:
        level = needs(method)
        if not level:
            return None  # open: health, reflection, the worker stream
        catalog = method.startswith(f"/{CATALOG_SERVICE}/") and level != "admin"
        return self._wrap(fn, method.rpartition("/")[2], level == "admin", catalog)

    def _wrap(self, fn: Callable[..., Any], action: str, admin: bool, catalog: bool) -> Callable[..., Any]:
        auth = self.auth
        worker = self.worker if catalog else None

        def enter(context: grpc.aio.ServicerContext) -> Any:
            peer = context.peer()
            metadata = context.invocation_metadata() or ()
            if worker is not None and auth.enabled and worker(metadata, context.auth_context()):
                return CURRENT.set(WORKER)
            principal = auth.authenticate(metadata, peer, action)
            if admin:
                auth.require_admin(principal, peer, action)
                if auth.enabled:
                    auth.audit.record(
                        "admin",
                        "allowed",
                        tenant=principal.tenant,
                        peer=peer,
                        action=action,
                        key=principal.key_name,
                    )
            return CURRENT.set(principal)

        if inspect.isasyncgenfunction(fn):

            async def generator(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                token = enter(context)
                try:
                    async for item in fn(request, context):
                        yield item
                finally:
                    # closed from another context when the call's task is ending
                    with contextlib.suppress(ValueError):
                        CURRENT.reset(token)

            return generator

        async def coroutine(request: Any, context: grpc.aio.ServicerContext) -> Any:
            token = enter(context)
            try:
                return await fn(request, context)
            finally:
                CURRENT.reset(token)

        return coroutine
