"""The two job engines behind `core.engine_client.EngineClient`, `memory` and `redis`, and
`make_engine`, which builds the one `--store` asks for with what the server wires beside it.

Each keeps jobs, the queue and events its own way; both speak `omnirt.types` dataclasses. An
engine imports `core` and `observability`, never an edge nor the other engine; only its store
may encode jobs as protobuf bytes (the memory engine's frozen jobs, Redis hashes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omnirt.controller.config import ControllerConfig
from omnirt.controller.core.catalog import Catalog
from omnirt.controller.core.encoded import ArrivingResults, EncodedJobs
from omnirt.controller.core.engine_client import EngineClient, SharedRedis
from omnirt.controller.observability.metrics import EngineMetrics


@dataclass(frozen=True)
class EngineParts:
    """An engine and what the server wires beside it, so that nothing probes behind `EngineClient`."""

    client: EngineClient
    metrics: EngineMetrics  # /metrics, and the counters of webhooks and realtime sessions
    # The memory engine's fast path (`core.encoded`): where the worker stream hands a result's
    # bytes as they came, and where Generate finds a finished job already encoded.
    arriving_results: ArrivingResults | None = None
    encoded_jobs: EncodedJobs | None = None
    # Subscribes a callback to the ids of the jobs the engine evicts from then on (the memory
    # engine; the artifact store deletes their objects at once). None: it does not tell (Redis,
    # whose expired jobs' objects the artifact store's sweep deletes).
    watch_evictions: Callable[[Callable[[str], None]], None] | None = None
    # The Redis engine's client and key prefix, for realtime sessions and webhook follows.
    shared: SharedRedis | None = None


def make_engine(config: ControllerConfig, catalog: Catalog) -> EngineParts:
    """The engine `config.store` asks for, in memory (default) or on Redis."""
    if config.store in ("", "memory"):
        from omnirt.controller.engines.memory.engine import MemoryEngine

        memory = MemoryEngine(config, catalog)
        return EngineParts(
            memory,
            memory.metrics,
            arriving_results=memory.store,
            encoded_jobs=memory.store,
            watch_evictions=memory.store.watch_evictions,
        )
    if config.store.startswith(("redis://", "rediss://", "unix://")):
        from omnirt.controller.engines.redis.engine import RedisEngine

        redis = RedisEngine(config, catalog)
        return EngineParts(
            redis,
            redis.metrics,
            arriving_results=redis.encodings,
            encoded_jobs=redis.encodings,
            shared=SharedRedis(redis.store.redis, redis.store.prefix),
        )
    raise ValueError(f"--store: expected memory or redis://HOST:PORT/DB, got {config.store!r}")
