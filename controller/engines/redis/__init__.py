"""The Redis engine: jobs, queue and events in Redis, shared by every controller (`--redis-url`)."""
