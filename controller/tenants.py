"""What the engines know of tenants: each job's owner, and the owner's quotas and weight.

The edges (`edges/auth.py`) turn an API key into a tenant and its `TenantPolicy`; the engines
store the tenant with each job, scope reads to it, enforce the quotas at submit and share the
queue fairly between tenants by weight. Without API keys every job belongs to the tenant ""
with no limits, as before tenants existed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's limits; 0 means no limit."""

    max_queued: int = 0  # jobs queued + running at once
    rate_per_s: float = 0.0  # submissions per second, token bucket
    burst: int = 0  # bucket size (0 = max(1, ceil(rate_per_s)))
    weight: float = 1.0  # share of dispatch when tenants wait at the same priority


UNLIMITED = TenantPolicy()
