"""The daemon helpers the tests use live in the package (`omnirt.testing`)."""

from omnirt.testing import Controller, Daemon, RedisServer, Worker, free_port, wait_for

__all__ = ["Controller", "Daemon", "RedisServer", "Worker", "free_port", "wait_for"]
