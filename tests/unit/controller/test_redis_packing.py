"""The store's connections pack commands in C: byte for byte what redis-py packs, and redis-py's
own path (with its checks) for what hiredis would pack otherwise."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from omnirt.controller.engines.redis import connection

COMMANDS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 0, "{omnirt}:", 3, "job-1", b"\x00\xffproto", -7, 2**63 - 1),
    ("HSET", b"{omnirt}:job:x", "state", "RUNNING", "note", "\u00e9t\u00e9 \U0001f98a", "empty", ""),
    ("ZADD", "{omnirt}:queue", 0.1, "job-2"),  # a float: redis-py's repr, not hiredis's
    ("SET", "k", memoryview(b"view")),
    ("SCRIPT LOAD", "return 1"),  # redis-py splits a name with a space
    ("PING",),
]


def packed(conn: Any, args: tuple[Any, ...]) -> bytes:
    return b"".join(bytes(part) for part in conn.pack_command(*args))


@pytest.mark.parametrize("args", COMMANDS, ids=lambda args: str(args[0]))
def test_our_connection_packs_what_redis_py_packs(args: tuple[Any, ...]) -> None:
    assert packed(connection.Connection(), args) == packed(aioredis.Connection(), args)


def test_a_bool_is_refused_as_redis_py_refuses_it() -> None:
    with pytest.raises(redis.exceptions.DataError):
        connection.Connection().pack_command("SET", "k", True)


def test_the_urls_scheme_still_picks_the_transport() -> None:
    kinds = {
        "redis://127.0.0.1:6379/0": connection.Connection,
        "rediss://127.0.0.1:6380/0": connection.SSLConnection,
        "unix:///tmp/redis.sock": connection.UnixDomainSocketConnection,
    }
    for url, kind in kinds.items():
        assert connection.connect(url).connection_pool.connection_class is kind, url
