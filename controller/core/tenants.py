"""What the engines know of tenants: each job's owner, and the owner's quotas and weight.

The edges (`edges/auth.py`) turn an API key into a tenant and its `TenantPolicy`; the engines
store the tenant with each job, scope reads to it, enforce the quotas at submit and share the
queue fairly between tenants by weight. Without API keys every job belongs to the tenant ""
with no limits, as before tenants existed.

Both engines use the pieces here: the quota errors (one wording on both stores), the token
bucket's arithmetic (Redis runs the same formula in its submit script), the per-model run-time
estimate that fair share charges a job, and the fair-share clock of the in-memory engine.

Fair share is start-time fair queuing with static ranks. A job of tenant t at priority p gets a
start tag S = max(now, F[t, p]) and moves F[t, p] to S + q / weight, where q is one job's
expected run time: a tenant that floods gets S = now, now + q, now + 2q, ... while another
tenant's single job gets S = now and passes all but the flood's first jobs. The queue ranks a
job by S where it used the enqueue time, so its structures (a heap with ranks fixed at push)
stay as they are, and priorities and aging work on S as they did on the enqueue time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omnirt.errors import QuotaExceeded


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's limits; 0 means no limit."""

    max_queued: int = 0  # jobs queued + running at once
    rate_per_s: float = 0.0  # submissions per second, token bucket
    burst: int = 0  # bucket size (0 = max(1, ceil(rate_per_s)))
    weight: float = 1.0  # share of dispatch when tenants wait at the same priority


UNLIMITED = TenantPolicy()

# Reasons of the quota-refusal metric (`omnirt_quota_refusals{tenant, reason}`).
REASON_QUEUED = "max_queued"
REASON_RATE = "rate"


def bucket_size(policy: TenantPolicy) -> int:
    """Tokens a full bucket holds: `burst`, or one second's worth (at least 1) when unset."""
    return policy.burst or max(1, math.ceil(policy.rate_per_s))


def queued_exceeded(tenant: str, active: int, policy: TenantPolicy) -> QuotaExceeded:
    """The refusal of a submission past `max_queued`."""
    return QuotaExceeded(
        f"tenant {tenant!r} has {active} jobs queued or running (max_queued {policy.max_queued}); "
        "retry when one finishes",
        retry_after_s=1.0,
    )


def rate_exceeded(tenant: str, policy: TenantPolicy, wait_s: float) -> QuotaExceeded:
    """The refusal of a submission past `rate_per_s` (`wait_s`: until the next token)."""
    return QuotaExceeded(
        f"tenant {tenant!r} is over its rate limit ({policy.rate_per_s:g} jobs/s, burst "
        f"{bucket_size(policy)}); retry in {wait_s:.3f} s",
        retry_after_s=wait_s,
    )


class TokenBucket:
    """A token bucket that starts full; `take` spends one token or says how long until one.

    Rate and size come with every call, so a reloaded key file applies at the next submission.
    """

    __slots__ = ("at", "tokens")

    def __init__(self, size: int, now: float) -> None:
        self.tokens = float(size)
        self.at = now

    def take(self, rate: float, size: int, now: float) -> float:
        """0.0 when a token was taken, else the seconds until one is there (nothing taken)."""
        self.tokens = min(float(size), self.tokens + max(0.0, now - self.at) * rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate


class Buckets:
    """One token bucket per tenant (tenants come from the key file: a bounded set)."""

    def __init__(self) -> None:
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, tenant: str, policy: TenantPolicy, now: float) -> float:
        """0.0 when the tenant may submit now (no limit, or a token taken), else the wait."""
        if policy.rate_per_s <= 0:
            return 0.0
        size = bucket_size(policy)
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = TokenBucket(size, now)
        return bucket.take(policy.rate_per_s, size, now)


class RunTimes:
    """Each model's expected run time per job (s): an EWMA of what workers took.

    A batch of n jobs counts its time / n for each. Every controller keeps its own estimate
    (the Redis engine passes it to its submit script); it starts at 1 s and never goes below
    1 ms, so a job always advances its tenant's clock.
    """

    INITIAL_S = 1.0
    FLOOR_S = 0.001
    ALPHA = 0.2  # weight of a new observation: a few dozen jobs settle a changed run time

    def __init__(self) -> None:
        self._by_model: dict[str, float] = {}

    def estimate(self, model: str) -> float:
        return self._by_model.get(model, self.INITIAL_S)

    def observe(self, model: str, seconds: float, batch_size: int = 1) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            return
        per_job = max(self.FLOOR_S, seconds / max(1, batch_size))
        old = self._by_model.get(model)
        self._by_model[model] = per_job if old is None else old + self.ALPHA * (per_job - old)


class FairClock:
    """The fair-share clock of the in-memory engine: F[tenant, priority] in seconds.

    Entries at or before `now` no longer hold anyone back (S = max(now, F)): they are swept as
    jobs are pushed, whenever the table doubled since the last sweep, so it stays bounded by
    the tenants with queued work at no cost per job.
    """

    def __init__(self) -> None:
        self._finish: dict[tuple[str, int], float] = {}
        self._sweep_at = 64

    def start(self, tenant: str, priority: int, cost_s: float, weight: float, now: float) -> float:
        """The start tag S of a new job; charges its tenant's clock `cost_s / weight`."""
        key = (tenant, priority)
        start = max(now, self._finish.get(key, now))
        self._finish[key] = start + cost_s / weight
        if len(self._finish) >= self._sweep_at:
            self._finish = {k: f for k, f in self._finish.items() if f > now}
            self._sweep_at = max(64, 2 * len(self._finish))
        return start

    def __len__(self) -> int:
        return len(self._finish)
