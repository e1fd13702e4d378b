"""Where the jobs with a webhook are kept while their events are delivered: memory or Redis.

A *follow* is one job's webhook and how far its events have been delivered (`cursor`, the
sequence of the last event handled) plus the state of the delivery in progress. In memory it
lives in a dict of this process. On Redis it is a hash per job and a sorted set of the times
at which each may be claimed: a controller claims a follow by moving that time to now + lease
(atomically, in a script, so two controllers never claim the same one), renews the lease while
it follows the job, and saves the cursor after each event. A controller that dies stops
renewing; after the lease another claims the follow and goes on from the saved cursor (the
event in flight is delivered again with the same `webhook-id`: at least once).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from omnirt.types import Webhook, WebhookEvent

# How long a follow's hash outlives its last save: past the job's own TTL and the retry
# window, a follow whose controller and job are both gone is dropped by Redis itself.
FOLLOW_TTL_S = 3 * 24 * 3600


@dataclass
class Follow:
    """One job's webhook and its delivery progress."""

    job_id: str
    tenant: str
    webhook: Webhook
    cursor: int = 0  # sequence of the last event handled (delivered, given up or skipped)
    failing_since_ms: int = 0  # first failed attempt since the last success (0 = none failing)
    attempts: int = 0  # attempts of the event after `cursor` so far
    last_progress_ms: int = 0  # when the last progress was delivered

    def encode(self) -> dict[str, str]:
        """As the fields of a Redis hash."""
        hook = {
            "url": self.webhook.url,
            "events": [str(e) for e in self.webhook.events],
            "progress_interval_ms": self.webhook.progress_interval_ms,
        }
        return {
            "job_id": self.job_id,
            "tenant": self.tenant,
            "webhook": json.dumps(hook),
            "cursor": str(self.cursor),
            "failing_since_ms": str(self.failing_since_ms),
            "attempts": str(self.attempts),
            "last_progress_ms": str(self.last_progress_ms),
        }

    @classmethod
    def decode(cls, fields: dict[bytes, bytes]) -> Follow:
        """From a Redis hash."""
        f = {k.decode(): v.decode() for k, v in fields.items()}
        hook = json.loads(f["webhook"])
        webhook = Webhook(
            url=hook["url"],
            events=[WebhookEvent(e) for e in hook["events"]],
            progress_interval_ms=int(hook["progress_interval_ms"]),
        )
        return cls(
            job_id=f["job_id"],
            tenant=f["tenant"],
            webhook=webhook,
            cursor=int(f.get("cursor", 0)),
            failing_since_ms=int(f.get("failing_since_ms", 0)),
            attempts=int(f.get("attempts", 0)),
            last_progress_ms=int(f.get("last_progress_ms", 0)),
        )


class FollowStore(Protocol):
    """Follows shared by the controllers of one store (or kept by this one)."""

    async def add(self, follow: Follow) -> None:
        """A new job to follow (claimable at once)."""
        ...

    async def claim(self, owner: str, limit: int, lease_ms: int, now_ms: int) -> list[Follow]:
        """Up to `limit` follows nobody holds (or whose holder's lease ran out), now `owner`'s."""
        ...

    async def renew(self, owner: str, job_ids: list[str], lease_ms: int, now_ms: int) -> set[str]:
        """Extend `owner`'s leases; returns the ids it no longer holds."""
        ...

    async def save(self, owner: str, follow: Follow) -> bool:
        """Store the follow's progress; False when `owner` no longer holds it."""
        ...

    async def done(self, owner: str, job_id: str) -> None:
        """The job's last event is handled: forget the follow."""
        ...

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """`owner` stops (SIGTERM): its follows are claimable at once, not after the lease."""
        ...


class MemoryFollows:
    """Follows of this process (the memory store): no sharing, no leases."""

    def __init__(self) -> None:
        self.follows: dict[str, Follow] = {}
        self.ready: list[str] = []

    async def add(self, follow: Follow) -> None:
        """Keep it and make it claimable."""
        self.follows[follow.job_id] = follow
        self.ready.append(follow.job_id)

    async def claim(self, owner: str, limit: int, lease_ms: int, now_ms: int) -> list[Follow]:
        """Up to `limit` of the follows added and not yet claimed, oldest first."""
        taken, self.ready = self.ready[: max(0, limit)], self.ready[max(0, limit) :]
        return [self.follows[i] for i in taken if i in self.follows]

    async def renew(self, owner: str, job_ids: list[str], lease_ms: int, now_ms: int) -> set[str]:
        """Nothing to renew; nothing is lost."""
        return set()

    async def save(self, owner: str, follow: Follow) -> bool:
        """The object itself is the stored state."""
        return follow.job_id in self.follows

    async def done(self, owner: str, job_id: str) -> None:
        """Forget it."""
        self.follows.pop(job_id, None)

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """Nobody else would take them: the process is going away."""


# KEYS: none (the prefix is ARGV[1], as in engines/redis/scripts.py)
_CLAIM = """
local p, now, lease, owner, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], ARGV[5]
local ids = redis.call('ZRANGEBYSCORE', p .. 'wh:due', '-inf', now, 'LIMIT', 0, limit)
local out = {}
for _, id in ipairs(ids) do
  local h = p .. 'wh:f:' .. id
  if redis.call('EXISTS', h) == 1 then
    redis.call('ZADD', p .. 'wh:due', now + lease, id)
    redis.call('HSET', h, 'owner', owner)
    table.insert(out, redis.call('HGETALL', h))
  else
    redis.call('ZREM', p .. 'wh:due', id)
  end
end
return out
"""
_RENEW = """
local p, now, lease, owner = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local lost = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  if redis.call('HGET', p .. 'wh:f:' .. id, 'owner') == owner then
    redis.call('ZADD', p .. 'wh:due', now + lease, id)
  else
    table.insert(lost, id)
  end
end
return lost
"""
_SAVE = """
local p, owner, id, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local h = p .. 'wh:f:' .. id
if redis.call('HGET', h, 'owner') ~= owner then return 0 end
for i = 5, #ARGV, 2 do redis.call('HSET', h, ARGV[i], ARGV[i + 1]) end
redis.call('EXPIRE', h, ttl)
return 1
"""
_RELEASE = """
local p, owner = ARGV[1], ARGV[2]
for i = 3, #ARGV do
  local h = p .. 'wh:f:' .. ARGV[i]
  if redis.call('HGET', h, 'owner') == owner then
    redis.call('HSET', h, 'owner', '')
    redis.call('ZADD', p .. 'wh:due', 0, ARGV[i])
  end
end
return 1
"""
_DONE = """
local p, owner, id = ARGV[1], ARGV[2], ARGV[3]
local h = p .. 'wh:f:' .. id
if redis.call('HGET', h, 'owner') ~= owner then return 0 end
redis.call('DEL', h)
redis.call('ZREM', p .. 'wh:due', id)
return 1
"""


class RedisFollows:
    """Follows in Redis, shared by every controller of the store (see the module's docstring)."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.p = prefix
        self._claim = redis.register_script(_CLAIM)
        self._renew = redis.register_script(_RENEW)
        self._save = redis.register_script(_SAVE)
        self._done = redis.register_script(_DONE)
        self._release = redis.register_script(_RELEASE)

    async def add(self, follow: Follow) -> None:
        """Store the hash and make it due now, in one transaction."""
        key = self.p + "wh:f:" + follow.job_id
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={**follow.encode(), "owner": ""})
            pipe.expire(key, FOLLOW_TTL_S)
            pipe.zadd(self.p + "wh:due", {follow.job_id: 0})
            await pipe.execute()

    async def claim(self, owner: str, limit: int, lease_ms: int, now_ms: int) -> list[Follow]:
        """Claim due follows for `lease_ms` (see `_CLAIM`)."""
        if limit <= 0:
            return []
        rows = await self._claim(keys=[], args=[self.p, now_ms, lease_ms, owner, limit])
        return [Follow.decode(dict(zip(row[::2], row[1::2], strict=True))) for row in rows]

    async def renew(self, owner: str, job_ids: list[str], lease_ms: int, now_ms: int) -> set[str]:
        """Extend the leases `owner` still holds."""
        if not job_ids:
            return set()
        lost = await self._renew(keys=[], args=[self.p, now_ms, lease_ms, owner, *job_ids])
        return {x.decode() for x in lost}

    async def save(self, owner: str, follow: Follow) -> bool:
        """Store the progress fields if `owner` still holds the follow."""
        pairs = [x for k, v in follow.encode().items() for x in (k, v)]
        return bool(await self._save(keys=[], args=[self.p, owner, follow.job_id, FOLLOW_TTL_S, *pairs]))

    async def done(self, owner: str, job_id: str) -> None:
        """Drop the follow if `owner` still holds it."""
        await self._done(keys=[], args=[self.p, owner, job_id])

    async def release(self, owner: str, job_ids: list[str]) -> None:
        """Make `owner`'s follows claimable now (see `_RELEASE`)."""
        if job_ids:
            await self._release(keys=[], args=[self.p, owner, *job_ids])
