"""The Redis scripts that need none of `scripts.PRELUDE`'s functions: the worker ids' claims and
the cluster's list of workers (`cluster.py`), and the tidying of the upkeep (listings, tenants'
active sets, fair share's tags). The keys are `scripts.py`'s.
"""

from __future__ import annotations

# Worker ids. A worker id belongs to one process: the first Hello with it takes the claim, and
# a Hello from another process is refused while the claim lives. Checking `workers` and then
# registering let two processes racing through two controllers both in; one script cannot.
# The claim lives a lease and is renewed with the `workers` entry (WORKERS_SEEN); a controller
# renews, lists and drops only what it still holds, never what another one took over.

# ARGV: p, worker id, instance ('' = an old worker: never the same process), owner, host, pid,
#       lease_ms. Returns {'ok'} or {'held', host, pid} (the holder, another process).
CLAIM_WORKER = r"""
local p, id, instance = ARGV[1], ARGV[2], ARGV[3]
local k = p .. 'worker-claim:' .. id
local held = redis.call('HMGET', k, 'instance', 'host', 'pid')
if held[1] and (instance == '' or held[1] ~= instance) then return {'held', held[2], held[3]} end
redis.call('DEL', k)
redis.call('HSET', k, 'instance', instance, 'owner', ARGV[4], 'host', ARGV[5], 'pid', ARGV[6])
redis.call('PEXPIRE', k, ARGV[7])
return {'ok'}
"""

# Renew the claims of this controller's workers and list them (workers, workers:seen). A claim
# that expired (Redis away past a lease, or restarted empty) is taken again; one another
# process or controller holds now is left alone, and its id returned: that worker must go.
# ARGV: p, owner, lease_ms, expiry_ms, then id, instance, host, pid, info (WorkerInfo proto)
# per worker. Returns the ids this controller no longer holds.
WORKERS_SEEN = r"""
local p, owner, lease, expiry = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local lost = {}
for i = 5, #ARGV, 5 do
  local id, instance = ARGV[i], ARGV[i + 1]
  local k = p .. 'worker-claim:' .. id
  local held = redis.call('HMGET', k, 'instance', 'owner')
  if held[1] and (held[1] ~= instance or held[2] ~= owner) then
    table.insert(lost, id)
  else
    if not held[1] then
      redis.call('HSET', k, 'instance', instance, 'owner', owner, 'host', ARGV[i + 2], 'pid', ARGV[i + 3])
    end
    redis.call('PEXPIRE', k, lease)
    redis.call('HSET', p .. 'workers', id, ARGV[i + 4])
    redis.call('ZADD', p .. 'workers:seen', expiry, id)
  end
end
return lost
"""

# A worker this controller held is gone: its claim and listing go, unless another controller
# (or process) holds the id by now. ARGV: p, owner, id, instance. Returns 1 when dropped.
DROP_WORKER = r"""
local p, owner, id, instance = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local k = p .. 'worker-claim:' .. id
local held = redis.call('HMGET', k, 'instance', 'owner')
if held[1] and (held[1] ~= instance or held[2] ~= owner) then return 0 end
redis.call('DEL', k)
redis.call('HDEL', p .. 'workers', id)
redis.call('ZREM', p .. 'workers:seen', id)
return 1
"""


# ---- tidying, from every controller's upkeep (each run is small: Redis serves meanwhile) ----

# Listing entries (`P jobs`, `P jobs:t:TENANT`) whose job expired or was evicted. Only entries
# created before max_score (a job younger than the job TTL cannot have expired) are looked at,
# `count` from `offset` on: the offset moves past the live ones (long queued or running jobs)
# and starts over at the end. ARGV: p, listing key (without p), max_score, offset, count.
# Returns {next offset, entries removed}.
SWEEP_LISTING = r"""
local p, key = ARGV[1], ARGV[1] .. ARGV[2]
local offset, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local ids = redis.call('ZRANGEBYSCORE', key, '-inf', ARGV[3], 'LIMIT', offset, count)
local gone = 0
for _, id in ipairs(ids) do
  if redis.call('EXISTS', p .. 'job:' .. id) == 0 then
    redis.call('ZREM', key, id)
    gone = gone + 1
  end
end
if #ids < count then return {0, gone} end
return {offset + #ids - gone, gone}
"""

# Members of a tenant's active set that are no longer QUEUED or RUNNING: a job evicted from
# Redis (maxmemory), or finished by an older controller that does not know tenants. Every
# other way out of the set is `finish` in the PRELUDE. ARGV: p, tenant, SSCAN cursor, count.
# Returns {next cursor, members removed}.
SWEEP_ACTIVE = r"""
local p = ARGV[1]
local key = p .. 'active:' .. ARGV[2]
local scan = redis.call('SSCAN', key, ARGV[3], 'COUNT', ARGV[4])
local gone = 0
for _, id in ipairs(scan[2]) do
  local state = redis.call('HGET', p .. 'job:' .. id, 'state')
  if state ~= 'QUEUED' and state ~= 'RUNNING' then
    redis.call('SREM', key, id)
    gone = gone + 1
  end
end
return {scan[1], gone}
"""

# Fair-share finish tags at or before now hold no one back (S = max(now, F)): they go, so
# `P fair` stays as small as the set of (tenant, priority) pairs with work queued ahead.
# ARGV: p, now (s). Returns the entries removed.
PRUNE_FAIR = r"""
local key = ARGV[1] .. 'fair'
local now = tonumber(ARGV[2])
local all = redis.call('HGETALL', key)
local gone = 0
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) <= now then
    redis.call('HDEL', key, all[i])
    gone = gone + 1
  end
end
return gone
"""
