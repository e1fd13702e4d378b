"""The store's Redis client, whose connections pack a command's arguments in C.

redis-py packs a command with hiredis, but first passes every argument through its own Python
`Encoder.encode` (an isinstance chain per argument; hiredis takes str, bytes and int as they
are). A busy controller on Redis sends a dozen arguments a command; skipping that loop saved a
few percent of its CPU per job (docs/BENCHMARKS.md, "What a job costs Redis"). Here a command
whose arguments are all str, bytes or int (not bool) goes to `hiredis.pack_command` at once; any
other (a float, a memoryview, a command name with a space, such as `SCRIPT LOAD`) takes
redis-py's own path, as before. Without hiredis nothing changes.
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


def _packing(base: type[aioredis.Connection] | type[aioredis.UnixDomainSocketConnection]) -> type:
    """`base` (a redis-py connection class) whose commands go to hiredis when `_plain`."""

    def pack_command(self: Any, *args: Any) -> list[bytes]:
        return _packed(args) or base.pack_command(self, *args)

    return type(base.__name__, (base,), {"pack_command": pack_command, "__module__": __name__})


# redis-py's connection class (as the URL's scheme picks it) -> ours.
_OURS: dict[type, type] = {
    base: _packing(base)
    for base in (aioredis.Connection, aioredis.SSLConnection, aioredis.UnixDomainSocketConnection)
}
Connection = _OURS[aioredis.Connection]
SSLConnection = _OURS[aioredis.SSLConnection]
UnixDomainSocketConnection = _OURS[aioredis.UnixDomainSocketConnection]


def connect(url: str, **options: Any) -> aioredis.Redis:
    """`redis.asyncio.Redis.from_url(url, **options)`, its connections packing in C (the URL's
    scheme still picks TCP, TLS or a Unix socket)."""
    client = aioredis.Redis.from_url(url, **options)
    pool = client.connection_pool
    pool.connection_class = _OURS.get(pool.connection_class, pool.connection_class)
    return client
