"""The store's Redis client, whose connections pack a command's arguments in C.

redis-py packs a command with hiredis, but first passes every argument through its own Python
`Encoder.encode` (an isinstance chain per argument; hiredis takes str, bytes and int as they
are). A busy controller on Redis sends a dozen arguments a command, and that loop was about a
tenth of its CPU. Here a command whose arguments are all str, bytes or int (not bool) goes to
`hiredis.pack_command` at once; any other (a float, a memoryview, a command name with a space,
such as `SCRIPT LOAD`) takes redis-py's own path, as before. Without hiredis nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # redis-py's pure-Python packer then
    _pack_command = None


def _plain(args: tuple[Any, ...]) -> bool:
    """Whether hiredis packs `args` as redis-py would: str, bytes and int only (a bool is an int
    that redis-py refuses), and a command name without a space (redis-py splits those)."""
    name = args[0]
    if (type(name) is str and " " in name) or (type(name) is bytes and b" " in name):
        return False
    for arg in args:
        kind = type(arg)
        if kind is not bytes and kind is not str and kind is not int:
            return False
    return True


def _packed(args: tuple[Any, ...]) -> list[bytes] | None:
    """`args` packed by hiredis, or None for redis-py's own path."""
    if _pack_command is not None and args and _plain(args):
        return [_pack_command(args)]
    return None


class Connection(aioredis.Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _packed(args) or super().pack_command(*args)


class SSLConnection(aioredis.SSLConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _packed(args) or super().pack_command(*args)


class UnixDomainSocketConnection(aioredis.UnixDomainSocketConnection):
    def pack_command(self, *args: Any) -> list[bytes]:
        return _packed(args) or super().pack_command(*args)


_OURS: dict[type, type] = {
    aioredis.Connection: Connection,
    aioredis.SSLConnection: SSLConnection,
    aioredis.UnixDomainSocketConnection: UnixDomainSocketConnection,
}


def connect(url: str, **options: Any) -> aioredis.Redis:
    """`redis.asyncio.Redis.from_url(url, **options)`, its connections packing in C (the URL's
    scheme still picks TCP, TLS or a Unix socket)."""
    client = aioredis.Redis.from_url(url, **options)
    pool = client.connection_pool
    pool.connection_class = _OURS.get(pool.connection_class, pool.connection_class)
    return client
