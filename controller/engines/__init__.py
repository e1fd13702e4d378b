"""The two job engines behind `core.engine_client.EngineClient`: `memory` and `redis`.

Each keeps jobs, the queue and events its own way; both speak `omnirt.types` dataclasses. An
engine imports `core` and `observability`, never an edge nor the other engine; only its store
may encode jobs as protobuf bytes (the memory engine's frozen jobs, Redis hashes).
"""
