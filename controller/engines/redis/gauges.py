"""The cluster's gauges, read from Redis once a second by every controller's upkeep: one script.

Queued jobs by model, by priority and by pinned queue, running jobs by model and active jobs by
tenant. A pipeline of one ZCARD per catalog model (the builtin catalog has about a hundred) cost
each controller a hundred commands to pack and a hundred replies to parse every second, a few
percent of a busy controller's CPU; the script counts the queues in Redis and answers only the
ones that hold jobs (and every pinned queue: the rule for unserved jobs reads those). With no job
queued anywhere (`qdepth` all zero) it counts no model queue at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omnirt.controller.engines.redis.records import by_model
from omnirt.controller.observability.metrics import Gauges

# ARGV: p, then the model ids to count. Returns {qdepth, runmodels (HGETALL each), queues
# {name, count, ...}: the models' that hold jobs and every pinned one, tenants {name, count, ...}:
# the active set's size of each tenant ("" always)}.
DEPTH = r"""
local p = ARGV[1]
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
  for i = 2, #ARGV do
    local n = redis.call('ZCARD', p .. 'queue:m:' .. ARGV[i])
    if n > 0 then
      queues[#queues + 1] = ARGV[i]
      queues[#queues + 1] = n
    end
  end
end
local tenants = {'', redis.call('SCARD', p .. 'active:')}
for _, t in ipairs(redis.call('SMEMBERS', p .. 'tenants')) do
  if t ~= '' then
    tenants[#tenants + 1] = t
    tenants[#tenants + 1] = redis.call('SCARD', p .. 'active:' .. t)
  end
end
return {queued, redis.call('HGETALL', p .. 'runmodels'), queues, tenants}
"""


def _pairs(flat: list[Any]) -> dict[str, int]:
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class GaugeReader:
    """Reads the gauges of the cluster whose keys start with `prefix`."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self._script = redis.register_script(DEPTH)
        self._prefix = prefix

    async def read(self, models: Sequence[str]) -> Gauges:
        queued, running, queues, tenants = await self._script(keys=[], args=[self._prefix, *models])
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
