"""The cluster's gauges, read from Redis once a second by every controller's upkeep: one script.

Queued jobs by model, by priority and by pinned queue, running jobs by model and active jobs by
tenant. A pipeline of one ZCARD per catalog model (the builtin catalog has about a hundred) cost
each controller a hundred commands to pack and a hundred replies to parse every second, a few
percent of a busy controller's CPU; the script counts the queues in Redis and answers only the
ones that hold jobs (and every pinned queue: the rule for unserved jobs reads those). With no job
queued anywhere (`qdepth` all zero) it counts no model queue at all.

The tenant "" (auth off, no quotas) keeps no set of its active jobs (a SADD and a SREM a job):
its gauge is the queued and running jobs less the named tenants' active ones.

Running jobs by model are counted by the controllers, not by the scripts a job runs through:
each controller knows the jobs its own workers run, and writes those counts here (its
`running:c:OWNER` hash, kept a few seconds past its last write) as it reads the gauges; the
gauge is the sum over the controllers alive. The `runmodels` hash it replaces cost every job
two HINCRBY (at its claim and at its end) for a number read once a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnirt.controller.engines.redis.records import by_model
from omnirt.controller.observability.metrics import Gauges

# ARGV: p, owner ('' = none: read only), now_ms, keep_ms, n, then n model, running pairs (the
# owner's), then the model ids to count. Returns {qdepth (HGETALL), running {model, count, ...}
# summed over the controllers alive, queues {name, count, ...}: the models' that hold jobs and
# every pinned one, tenants {name, count, ...}: the active set's size of each named tenant, and
# "" (always) counted}.
DEPTH = r"""
local p, owner, now, keep = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local first = 6 + 2 * tonumber(ARGV[5])
if owner ~= '' then
  local mine = p .. 'running:c:' .. owner
  redis.call('DEL', mine)
  if first > 6 then redis.call('HSET', mine, unpack(ARGV, 6, first - 1)) end
  redis.call('PEXPIRE', mine, keep)
  redis.call('ZADD', p .. 'controllers', now + keep, owner)
  redis.call('ZREMRANGEBYSCORE', p .. 'controllers', '-inf', now)
end
local sums, running = {}, {}
for _, c in ipairs(redis.call('ZRANGE', p .. 'controllers', 0, -1)) do
  local counts = redis.call('HGETALL', p .. 'running:c:' .. c)
  for i = 1, #counts, 2 do sums[counts[i]] = (sums[counts[i]] or 0) + tonumber(counts[i + 1]) end
end
for model, n in pairs(sums) do
  running[#running + 1] = model
  running[#running + 1] = n
end
local queued = redis.call('HGETALL', p .. 'qdepth')
local any = false
for i = 2, #queued, 2 do
  if tonumber(queued[i]) ~= 0 then any = true end
end
local queues = {}
for _, q in ipairs(redis.call('SMEMBERS', p .. 'pinned')) do
  queues[#queues + 1] = q
  queues[#queues + 1] = redis.call('ZCARD', p .. 'queue:m:' .. q)
end
if any then
  for i = first, #ARGV do
    local n = redis.call('ZCARD', p .. 'queue:m:' .. ARGV[i])
    if n > 0 then
      queues[#queues + 1] = ARGV[i]
      queues[#queues + 1] = n
    end
  end
end
-- The tenant "" (auth off) has no set: its jobs are the queued and running ones of no tenant.
local tenants, named = {}, 0
for _, t in ipairs(redis.call('SMEMBERS', p .. 'tenants')) do
  if t ~= '' then
    local n = redis.call('SCARD', p .. 'active:' .. t)
    tenants[#tenants + 1] = t
    tenants[#tenants + 1] = n
    named = named + n
  end
end
local all = redis.call('ZCARD', p .. 'queue') + redis.call('ZCARD', p .. 'running')
tenants[#tenants + 1] = ''
tenants[#tenants + 1] = math.max(0, all - named)
return {queued, running, queues, tenants}
"""


def _pairs(flat: list[Any]) -> dict[str, int]:
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class GaugeReader:
    """Reads the gauges of the cluster whose keys start with `prefix`."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self._script = redis.register_script(DEPTH)
        self._prefix = prefix

    async def read(
        self,
        models: Sequence[str],
        owner: str = "",
        running_here: dict[str, int] | None = None,
        now_ms: int = 0,
        keep_ms: int = 0,
    ) -> Gauges:
        """The gauges of the cluster for the catalog's `models`, after writing what controller
        `owner` runs (`running_here`: model -> jobs on its workers), which counts until `keep_ms`
        after `now_ms`; with no `owner`, only read."""
        counts = [x for model, n in (running_here or {}).items() if n > 0 for x in (model, n)]
        args = [self._prefix, owner, now_ms, keep_ms, len(counts) // 2, *counts, *models]
        queued, running, queues, tenants = await self._script(keys=[], args=args)
        by_queue = {queue: n for queue, n in _pairs(queues).items() if n > 0 or "@" in queue}
        return Gauges(
            queued_by_model=by_model(by_queue),
            queued_by_priority={int(k): n for k, n in _pairs(queued).items() if n > 0},
            running_by_model={m: n for m, n in by_model(_pairs(running)).items() if n > 0},
            # "" (no tenant) is read always but shown once it had jobs (the metrics keep a
            # tenant they saw, at 0).
            active_by_tenant={t: n for t, n in _pairs(tenants).items() if t or n},
            queued_by_queue=by_queue,
        )
