"""The HTTP side of the load: one aiohttp session, JSON POSTs, non-200 answers as failures."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp


class HttpFailure(Exception):
    """An answer other than 200; `failure_code` (HTTP_503, ...) is what the load driver counts."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.failure_code = f"HTTP_{status}"


def session(
    ssl_context: ssl.SSLContext | None = None, headers: dict[str, str] | None = None
) -> aiohttp.ClientSession:
    """A client session with no connection cap (the load driver bounds the calls in flight).

    `ssl_context` verifies an https server (one handshake per kept-alive connection); `headers`
    go with every request (the API key's `Authorization`)."""
    connector = aiohttp.TCPConnector(limit=0, ssl=ssl_context if ssl_context is not None else True)
    return aiohttp.ClientSession(
        connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=600)
    )


async def post_json(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> bytes:
    """POST `body` as JSON; the answer's bytes, or HttpFailure."""
    async with client.post(url, json=body) as response:
        data = await response.read()
        if response.status != 200:
            raise HttpFailure(response.status, data)
        return data
