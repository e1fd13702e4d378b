"""Which webhook URLs the controller may call: every address the URL's host has (its shape is a
request rule, `core.validation.parse_webhook_url`).

A webhook makes the controller send a request wherever a client says, so without a rule it
would reach the cloud metadata service, Redis on loopback or any host of the private network
(server-side request forgery). Only public addresses are allowed unless the operator names a
range or a host with `--webhook-allow`. The check runs when the job is submitted (so a refused
URL is INVALID_ARGUMENT and nothing is queued) and again, in `CheckedResolver`, for each
delivery's own connection: a name that resolved to a public address at submission and to a
private one later (DNS rebinding) is refused then too, and the connection goes to the very
address that was checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Any

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from omnirt.controller.core.bounds import bad, echo
from omnirt.controller.core.validation import WEBHOOK_URL, parse_webhook_url
from omnirt.errors import InvalidRequest

# A submission waits this long at most for the URL's host to resolve (a dead DNS server would
# otherwise hold the call for the resolver's own retries, 10 s and more).
RESOLVE_TIMEOUT_S = 5.0
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _plain(address: IpAddress) -> IpAddress:
    """An IPv4-mapped IPv6 address (::ffff:10.0.0.1) as the IPv4 address it reaches."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def refused_kind(address: IpAddress) -> str:
    """Why a webhook may not reach `address` by default ("" = a public address, allowed)."""
    address = _plain(address)
    for kind in ("loopback", "unspecified", "link_local", "multicast", "private", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:  # shared (100.64/10), 6to4 and other special ranges
        return "non-global"
    return ""


@dataclass(frozen=True)
class AddressPolicy:
    """`--webhook-allow`: ranges and host names allowed although not public."""

    networks: tuple[IpNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, allow: tuple[str, ...]) -> AddressPolicy:
        """From the flag's items: a CIDR or an address is a range, anything else a host name."""
        networks: list[IpNetwork] = []
        hosts: set[str] = set()
        for item in allow:
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if not item or "/" in item or any(c.isspace() for c in item):
                    raise ValueError(f"--webhook-allow: {item!r} is neither a CIDR nor a host name") from None
                hosts.add(item.lower().rstrip("."))
        return cls(tuple(networks), frozenset(hosts))

    def host_allowed(self, host: str) -> bool:
        """The operator named this host: all its addresses are allowed."""
        return host.lower().rstrip(".") in self.hosts

    def refusal(self, address: IpAddress) -> str:
        """Why `address` is refused ("" = allowed)."""
        kind = refused_kind(address)
        if not kind:
            return ""
        plain = _plain(address)
        if any(plain in net or address in net for net in self.networks):
            return ""
        return kind

    async def check(self, url: str) -> None:
        """Resolve the URL's host (off the event loop) and refuse it unless every address is allowed."""
        parts = parse_webhook_url(url)
        host = parts.hostname or ""
        if self.host_allowed(host):
            return
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S):
                addresses = await resolve(host, parts.port or (443 if parts.scheme == "https" else 80))
        except TimeoutError:
            raise bad(
                WEBHOOK_URL, f"host {echo(host)} did not resolve within {RESOLVE_TIMEOUT_S:g} s"
            ) from None
        except (OSError, UnicodeError) as exc:
            raise bad(WEBHOOK_URL, f"host {echo(host)} does not resolve ({exc})") from None
        for address in addresses:
            kind = self.refusal(address)
            if kind:
                raise InvalidRequest(
                    f"{WEBHOOK_URL}: {echo(host)} resolves to {address}, a {kind} address: refused "
                    "unless the operator allows it (--webhook-allow)",
                    field=WEBHOOK_URL,
                )


async def resolve(host: str, port: int) -> list[IpAddress]:
    """Every address of `host` (getaddrinfo in the loop's thread pool)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # The scope of a link-local IPv6 address ("fe80::1%eth0") is not part of the address.
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


class RefusedAddress(OSError):
    """A delivery's host resolved to an address the policy refuses (not retried)."""


class CheckedResolver(AbstractResolver):
    """aiohttp's resolver with the policy applied: the connection goes only to checked addresses."""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy
        self.inner = ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> list[ResolveResult]:
        """The host's addresses, or RefusedAddress when one of them is not allowed."""
        results = await self.inner.resolve(host, port, family)
        if self.policy.host_allowed(host):
            return results
        for result in results:
            address = ipaddress.ip_address(result["host"].split("%", 1)[0])
            kind = self.policy.refusal(address)
            if kind:
                raise RefusedAddress(
                    f"{host} resolves to {address}, a {kind} address (not in --webhook-allow)"
                )
        return results

    async def close(self) -> None:
        """Close the inner resolver."""
        await self.inner.close()
