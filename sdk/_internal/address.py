"""HOST:PORT helpers shared by the SDK, the controller and the worker."""

from __future__ import annotations

import ipaddress


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT (or HOST) names a loopback host (127.0.0.0/8, ::1, localhost).

    False for 0.0.0.0, [::], an empty host and any other name or address.
    """
    host = address.rpartition(":")[0] if ":" in address and not address.endswith("]") else address
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
