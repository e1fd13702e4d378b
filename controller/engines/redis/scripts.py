"""The Lua scripts behind the Redis job store: every state change is one atomic script.

Each script checks the state it expects (and the assignment, where a worker reports) before it
changes anything, so two controllers racing for one job cannot both win: the loser gets "no"
and the state it found. Keys (P is the prefix, `{omnirt}:` by default; the braces make it a Redis
Cluster hash tag, so every key lives in one slot):

    P job:ID          hash: static (Job proto of the fixed fields), request (GenerateRequest
                      proto), fingerprint, model, bkey (batch key), skey and srows (step key
                      and rows: joining a worker's running step batch), rank, priority, tenant, state,
                      attempts, assignment, owner, worker, enqueued_ms, started_ms, finished_ms,
                      deadline_ms (0: none; absent in jobs of controllers before it),
                      error / progress / result (protos), artifact:N (bytes) or artifact_path:N
    P events:ID       stream of JobEvent protos, one or several to an entry; entry id 0-N is
                      the sequence N of its last event (event_log.py)
    P queue           zset of every queued job by rank (bounds the queue, gives positions)
    P queue:m:MODEL   zset of the model's queued jobs by rank (what a controller may dispatch)
    P queue:b:KEY     zset of queued jobs that can share one pipeline call
    P qdepth          hash priority -> queued jobs (the queue-depth gauge)
    P running         zset job -> lease expiry (ms); the holder renews it
    P running:c:OWNER hash model -> jobs running on controller OWNER's workers, as it counts
                      them (written with the gauges each second; expires when OWNER stops)
    P controllers     zset controller -> when its running:c hash expires (the live ones)
    P runmodels       hash model -> running jobs: written by controllers before running:c
                      (two HINCRBY a job), read by none since
    P deadlines       zset job -> deadline (ms) of jobs not final yet
    P jobs            zset job -> creation time (ms): the listing
    P jobs:t:TENANT   zset: the same for one (named) tenant's jobs
    P idem:KEY        string: the job of an idempotency key of the tenant "" (its own TTL)
    P idem@TENANT:KEY string: the same for a named tenant (tenant names hold no ':' or '@',
                      and no key of the tenant "" starts `idem@`: the two layouts never meet)
    P tenants         set of the tenants that submitted jobs ("" included)
    P active:TENANT   set of a named tenant's jobs QUEUED or RUNNING: max_queued, the active
                      gauge (the tenant "" has no quotas: its gauge is counted, see gauges.py;
                      controllers before that kept `active:` too, which the sweep empties)
    P bucket:TENANT   hash tokens, at (s): the tenant's rate_per_s token bucket
    P fair            hash "TENANT|PRIORITY" -> F (s): fair share's finish tags
    P workers         hash worker id -> WorkerInfo proto (+ P workers:seen zset id -> expiry)
    P worker-claim:ID hash instance, owner, host, pid: the process that holds worker id ID and
                      the controller it is connected to; expires a lease after its last renewal
    P notify          pub/sub channel: "q" (a job was queued), "e ID" (job ID changed state, or
                      has a new event: every waiter looks), "E ID1 ID2 ..." (the same for
                      several jobs: the final states of one FINISH call), "p ID" (job ID has
                      new events of its run: watchers look, `wait` sleeps on),
                      "c ID ASSIGNMENT OWNER REASON" (stop a running job), "d WORKER" (drain)

Rank = enqueued_seconds / aging_s - priority: lower runs first, as in the in-memory queue. A job
of a named tenant uses its fair-share start tag S where the others use the enqueue time (see
`controller/core/tenants.py`): S = max(now, F[tenant, priority]), then F = S + q / weight; with no
aging its rank is S / 2**32 - priority (an aging of 136 years: S orders a priority's jobs, and
the rank stays in its priority's band). The tenant "" ranks exactly as before tenants existed.

Numbers that go back into Redis are written with '%.17g' (Lua's own tostring keeps 14 digits):
F and the bucket read back exactly what was computed, so the ranks equal the Python formula's.
"""

from __future__ import annotations

PRELUDE = r"""
-- "q" (a job was queued) once per script call, however many jobs it queues (`many`).
local queued_told = false
local function tell_queued(p)
  if not queued_told then redis.call('PUBLISH', p .. 'notify', 'q') end
  queued_told = true
end

-- "e ID" (job ID reached a final state) at once; or, while `told` is a list (FINISH's calls
-- of many jobs), once at the end of the call for all of them: "e ID" for one, "E ID1 ID2 ..."
-- for several (a controller before "E" ignores it: its waiters find the state on their
-- one-second look).
local told = nil
local function tell_final(p, id)
  if told then table.insert(told, id) else redis.call('PUBLISH', p .. 'notify', 'e ' .. id) end
end
local function tell_finals(p)
  if told and #told == 1 then redis.call('PUBLISH', p .. 'notify', 'e ' .. told[1]) end
  if told and #told > 1 then redis.call('PUBLISH', p .. 'notify', 'E ' .. table.concat(told, ' ')) end
  told = nil
end

local function enqueue(p, id, model, bkey, rank, priority)
  redis.call('ZADD', p .. 'queue', rank, id)
  redis.call('ZADD', p .. 'queue:m:' .. model, rank, id)
  if bkey ~= '' then redis.call('ZADD', p .. 'queue:b:' .. bkey, rank, id) end
  redis.call('HINCRBY', p .. 'qdepth', priority, 1)
end

local function dequeue(p, id, model, bkey, priority)
  if redis.call('ZREM', p .. 'queue', id) == 1 then
    redis.call('HINCRBY', p .. 'qdepth', priority, -1)
  end
  redis.call('ZREM', p .. 'queue:m:' .. model, id)
  if bkey ~= '' then redis.call('ZREM', p .. 'queue:b:' .. bkey, id) end
end

-- A job evicted from Redis (maxmemory) leaves its id queued: it is dropped, never dispatched
-- (its hash, and with it its priority for `qdepth`, is gone).
local function drop_evicted(p, id, m, bkey)
  redis.call('ZREM', p .. 'queue', id)
  redis.call('ZREM', p .. 'queue:m:' .. m, id)
  if bkey ~= '' then redis.call('ZREM', p .. 'queue:b:' .. bkey, id) end
end

local function evicted(p, id, m, bkey)
  if redis.call('EXISTS', p .. 'job:' .. id) == 1 then return false end
  drop_evicted(p, id, m, bkey)
  return true
end

-- The fields of a queued job that `take` reads (CLAIM reads its head's once for both).
local function take_fields(jk)
  return redis.call('HMGET', jk, 'model', 'bkey', 'priority', 'request', 'enqueued_ms', 'traceparent',
    'tenant', 'attempts')
end

-- The first n+1 of a model's queue {id1, rank1, id2, ...}, or {} (not checked for eviction:
-- see CLAIM): the head, and whether a call of up to n jobs may empty the queue.
local function model_head(p, model, n)
  return redis.call('ZRANGE', p .. 'queue:m:' .. model, 0, n, 'WITHSCORES')
end

-- Up to `limit` of the queued jobs `ids` (but `skip`) that may share a call, with take_fields
-- of each, and the set of those found evicted (no hash, so no bkey), which leave the queues here
-- (`evicted` without its EXISTS: the fields are read anyway).
local function peers_fields(p, ids, model, bkey, skip, limit)
  local kept, fields, gone = {}, {}, {}
  for _, other in ipairs(ids) do
    if #kept < limit and other ~= skip then
      local f = take_fields(p .. 'job:' .. other)
      if f[2] then
        table.insert(kept, other)
        table.insert(fields, f)
      else
        gone[other] = true
        drop_evicted(p, other, model, bkey)
      end
    end
  end
  return kept, fields, gone
end

-- Mark the queued jobs `ids` RUNNING under assignment `asg` of `owner`, appending to `out` each
-- one's id, attempts, request, enqueued_ms, traceparent and tenant. `fields[i]` is take_fields
-- of ids[i], where the caller read them.
local function take(p, ids, asg, owner, now, lease, out, fields)
  for i, id in ipairs(ids) do
    local jk = p .. 'job:' .. id
    local f = (fields and fields[i]) or take_fields(jk)
    dequeue(p, id, f[1], f[2], f[3])
    local attempts = (tonumber(f[8] or '0') or 0) + 1
    redis.call('HSET', jk, 'state', 'RUNNING', 'assignment', asg, 'owner', owner, 'started_ms', now,
      'attempts', attempts)
    if attempts > 1 then redis.call('HDEL', jk, 'progress') end  -- an earlier attempt's
    redis.call('ZADD', p .. 'running', now + lease, id)
    table.insert(out, id)
    table.insert(out, tostring(attempts))
    table.insert(out, f[4])
    table.insert(out, f[5])
    table.insert(out, f[6] or '')
    table.insert(out, f[7] or '')
  end
end

local function add_event(p, id, event)
  if event ~= '' then redis.call('XADD', p .. 'events:' .. id, '0-*', 'e', event) end
end

-- Log `k` events of job `id` in one stream entry (event_log.py says the layout): `last` in field
-- e, the k-1 before it packed in m, r the index in m of a RESULT event without its result. The
-- entry's id is the sequence of its last event: the stream's top + k.
local function log_events(p, id, k, last, packed, r)
  k = tonumber(k)
  if k < 2 then add_event(p, id, last); return end
  local key = p .. 'events:' .. id
  local top = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  local seq = 0
  if top[1] then seq = tonumber(string.match(top[1][1], '%d+$')) end
  if r ~= '' then
    redis.call('XADD', key, '0-' .. (seq + k), 'e', last, 'm', packed, 'r', r)
  else
    redis.call('XADD', key, '0-' .. (seq + k), 'e', last, 'm', packed)
  end
end

-- The fields of a job that `finish` reads (FINISH reads them once for both).
local function finish_fields(jk)
  return redis.call('HMGET', jk, 'state', 'owner', 'assignment', 'model', 'bkey', 'priority', 'worker',
    'tenant', 'deadline_ms')
end

-- Move a job to a final state, logging the events `ev` ({k, last, packed, r} for log_events:
-- the run's last events, RESULT, the final state); returns the state, owner, assignment and
-- worker it had. The job leaves its tenant's active set here, the one way every final state
-- goes: counted out exactly once. `f` is `finish_fields` of the job, when the caller read them;
-- `worker` ('' = unchanged) the worker that ran it.
local function finish(p, id, state, now, ttl, error, result, ev, f, worker)
  local jk = p .. 'job:' .. id
  f = f or finish_fields(jk)
  if (f[1] == 'QUEUED' or f[1] == 'RUNNING') and (f[8] or '') ~= '' then
    redis.call('SREM', p .. 'active:' .. f[8], id)
  end
  if f[1] == 'QUEUED' then dequeue(p, id, f[4], f[5], f[6]) end
  if f[1] == 'RUNNING' then
    redis.call('ZREM', p .. 'running', id)
  end
  -- '0': no deadline, nothing in `deadlines` (none: a job from before the field, look).
  if f[9] ~= '0' then redis.call('ZREM', p .. 'deadlines', id) end
  local set = {'state', state, 'finished_ms', now}
  if error ~= '' then table.insert(set, 'error'); table.insert(set, error) end
  if result ~= '' then table.insert(set, 'result'); table.insert(set, result) end
  if (worker or '') ~= '' then table.insert(set, 'worker'); table.insert(set, worker) end
  redis.call('HSET', jk, unpack(set))
  log_events(p, id, ev[1], ev[2], ev[3], ev[4])
  redis.call('EXPIRE', jk, ttl)
  redis.call('EXPIRE', p .. 'events:' .. id, ttl)
  tell_final(p, id)
  return {f[1], f[2] or '', f[3] or '', f[7] or ''}
end
"""

# Prepended to SUBMIT (with PRELUDE). The tenant's token bucket (`tenants.TokenBucket`: the same
# arithmetic on the same numbers): 0 when a token was taken, else the seconds until one is there
# (nothing taken). `at` never goes back: a controller whose clock is behind another's refills
# nothing, not a second time.
QUOTAS = r"""
local function take_token(key, rate, size, now)
  local b = redis.call('HMGET', key, 'tokens', 'at')
  local tokens, at = tonumber(b[1] or '') or size, tonumber(b[2] or '') or now
  tokens = math.min(size, tokens + math.max(0, now - at) * rate)
  if now > at then at = now end
  local wait = 0
  if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
  redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'at', string.format('%.17g', at))
  -- A bucket left alone this long is full again: the key may go.
  redis.call('PEXPIRE', key, math.ceil(size / rate * 1000) + 1000)
  return wait
end

-- Fair share (`tenants.FairClock`): the job's start tag S and its tenant's new finish tag.
local function fair_rank(p, tenant, priority, now, cost, weight, aging)
  local key = tenant .. '|' .. priority
  local s = now
  local f = tonumber(redis.call('HGET', p .. 'fair', key) or '')
  if f and f > s then s = f end
  redis.call('HSET', p .. 'fair', key, string.format('%.17g', s + cost / weight))
  if aging <= 0 then aging = 4294967296 end
  return s / aging - tonumber(priority)
end
"""

# ARGV: p, id, idem_key, idem_ttl_s, max_queue, static, request, fingerprint, model, bkey, rank
#       (used for the tenant ""), now_ms, deadline_ms, priority, queued_event, traceparent,
#       tenant, max_queued (0 = none), rate_per_s (0 = none), bucket size, cost_s (q), weight,
#       aging_s. Returns {'ok'}, {'dup', ID}, {'full'}, {'quota', 'max_queued', ACTIVE} or
#       {'quota', 'rate', WAIT_S}: quotas after the idempotency lookup (a duplicate costs
#       nothing), a token spent only by a job that is queued.
SUBMIT = r"""
local p, id, idem, tenant = ARGV[1], ARGV[2], ARGV[3], ARGV[17]
-- The listing entry first: already there, this is a retried call of a job queued before (the
-- job's own EXISTS, one command more, is what it replaced); a refusal takes it out again.
if redis.call('ZADD', p .. 'jobs', 'NX', ARGV[12], id) == 0 then return {'ok'} end
local function refuse(answer)
  redis.call('ZREM', p .. 'jobs', id)
  return answer
end
local ik = p .. 'idem:' .. idem
if tenant ~= '' then ik = p .. 'idem@' .. tenant .. ':' .. idem end
if idem ~= '' then
  local existing = redis.call('GET', ik)
  if existing and redis.call('EXISTS', p .. 'job:' .. existing) == 1 then return refuse({'dup', existing}) end
end
if redis.call('ZCARD', p .. 'queue') >= tonumber(ARGV[5]) then return refuse({'full'}) end
local active = p .. 'active:' .. tenant
local max_queued, rate = tonumber(ARGV[18]), tonumber(ARGV[19])
if max_queued > 0 then
  local n = redis.call('SCARD', active)
  if n >= max_queued then return refuse({'quota', 'max_queued', n}) end
end
if rate > 0 then
  local wait = take_token(p .. 'bucket:' .. tenant, rate, tonumber(ARGV[20]), tonumber(ARGV[12]) / 1000)
  if wait > 0 then return refuse({'quota', 'rate', string.format('%.17g', wait)}) end
end
local rank = ARGV[11]
if tenant ~= '' then
  rank = fair_rank(p, tenant, ARGV[14], tonumber(ARGV[12]) / 1000, tonumber(ARGV[21]),
    tonumber(ARGV[22]), tonumber(ARGV[23]))
end
local fields = {'static', ARGV[6], 'request', ARGV[7], 'fingerprint', ARGV[8],
  'model', ARGV[9], 'bkey', ARGV[10], 'rank', rank, 'priority', ARGV[14], 'state', 'QUEUED',
  'attempts', 0, 'enqueued_ms', ARGV[12], 'traceparent', ARGV[16], 'tenant', tenant, 'deadline_ms', ARGV[13]}
if (ARGV[24] or '') ~= '' then
  table.insert(fields, 'skey'); table.insert(fields, ARGV[24])
  table.insert(fields, 'srows'); table.insert(fields, ARGV[25])
end
redis.call('HSET', p .. 'job:' .. id, unpack(fields))
enqueue(p, id, ARGV[9], ARGV[10], rank, ARGV[14])
if tonumber(ARGV[13]) > 0 then redis.call('ZADD', p .. 'deadlines', ARGV[13], id) end
if tenant ~= '' then redis.call('ZADD', p .. 'jobs:t:' .. tenant, ARGV[12], id) end
if tenant ~= '' then  -- "" (auth off) is always one, and its active jobs are counted (gauges.py)
  redis.call('SADD', active, id)
  redis.call('SADD', p .. 'tenants', tenant)
end
if idem ~= '' then redis.call('SET', ik, id, 'EX', ARGV[4]) end
add_event(p, id, ARGV[15])
tell_queued(p)
return {'ok'}
"""

# Take the best queued job among the given models (and up to limit-1 jobs that can share its
# call), mark them RUNNING under one assignment held by `owner`.
# The batch rule (key, limit, window) is controller/core/batching.py's; this is its copy inside
# Redis, held to the same answers by tests/integration/test_batching_rule.py.
# ARGV: p, now_ms, lease_ms, owner, assignment, window_ms, busy_window_ms (the window while jobs
# of the model run, when longer), then per model: model, limit, busy ('1': jobs of it run, as
# the controller knows: its own workers' and the cluster's gauge).
# Returns {} (nothing), {'wait', model, due_ms} (the head waits for batch companions), or
# {'ok', model, empty, id1, attempts1, request1, enqueued_ms1, traceparent1, tenant1, id2, ...},
# `empty` the given models whose queues are empty now (newline separated).
CLAIM = r"""
local p, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local owner, asg, window, busy = ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local best, score, model, limit, f, queued, running = nil, nil, nil, 1, nil, nil, false
local empty = {}
repeat
  best, empty = nil, {}
  for i = 8, #ARGV, 3 do
    local head = model_head(p, ARGV[i], tonumber(ARGV[i + 1]))
    if not head[1] then
      table.insert(empty, ARGV[i])
    elseif best == nil or tonumber(head[2]) < score then
      best, score, model, limit, queued = head[1], tonumber(head[2]), ARGV[i], tonumber(ARGV[i + 1]), head
      running = ARGV[i + 2] == '1'
    end
  end
  if best == nil then return {} end
  -- Every job hash has a bkey ('' when it never batches): none means it was evicted.
  f = take_fields(p .. 'job:' .. best)
  if not f[2] then evicted(p, best, model, '') end
until f[2]
local bkey = f[2]
local ids, fields, gone = {best}, {f}, {}
if bkey ~= '' and limit > 1 then
  local peers = redis.call('ZRANGE', p .. 'queue:b:' .. bkey, 0, limit)
  if busy > window and running then window = busy end
  if window > 0 and #peers < limit then
    local due = tonumber(f[5]) + window
    if due > now then return {'wait', model, tostring(due)} end
  end
  local kept, more
  kept, more, gone = peers_fields(p, peers, model, bkey, best, limit - 1)
  for i, other in ipairs(kept) do
    table.insert(ids, other)
    table.insert(fields, more[i])
  end
end
local out = {'ok', model, ''}
take(p, ids, asg, owner, now, lease, out, fields)
-- The call emptied its model's queue when the queue's first limit+1 (read with the head: the
-- whole queue, when fewer) were all taken or evicted: say so.
if #queued <= 2 * limit then
  for _, id in ipairs(ids) do gone[id] = true end
  local left = false
  for j = 1, #queued, 2 do
    if not gone[queued[j]] then left = true end
  end
  if not left then table.insert(empty, model) end
end
out[3] = table.concat(empty, '\n')
return out
"""

# Take the best queued job that may join a step batch running on one of this controller's
# workers (beside its slots), with the queued jobs that may share its call (its batch key) as the
# batch has room for, and mark them RUNNING under `assignment`. The rule is
# controller/core/batching.py's (`step_key`, `may_join`, `join_room`, `holds_back`) and the memory
# engine's (in queue order: the first of its model's queue that fits, and no queued job ahead of
# it that the worker serves is of higher priority or another tenant's); this is its copy inside
# Redis, held to the same answers by tests/integration/test_join_rule.py. A job deeper than
# `depth` in the queue waits its turn.
# ARGV: p, now_ms, lease_ms, owner, assignment, depth, then per running batch: model, step key id,
# rows it can take, the models the worker serves ("|a|b|"), the model's batch limit.
# Returns {} (nothing), or {'ok', model, step key id, id1, attempts1, request1, enqueued_ms1,
# traceparent1, tenant1, id2, ...}.
CLAIM_JOIN = r"""
local p, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local owner, asg, depth = ARGV[4], ARGV[5], tonumber(ARGV[6])
-- holds_back: a job ahead that the worker serves, of higher priority or another tenant.
local function overtakes(id, served)
  local me = redis.call('HMGET', p .. 'job:' .. id, 'priority', 'tenant')
  for _, other in ipairs(redis.call('ZRANGE', p .. 'queue', 0, depth - 1)) do
    if other == id then return false end
    local f = redis.call('HMGET', p .. 'job:' .. other, 'model', 'priority', 'tenant')
    if f[1] and string.find(served, '|' .. f[1] .. '|', 1, true)
        and (tonumber(f[2]) > tonumber(me[1]) or (f[3] or '') ~= (me[2] or '')) then
      return true
    end
  end
  return true
end
-- The first job of the model's queue (within `depth`) of the step key whose rows fit: id, rank, rows.
local function first_fit(model, skey, room)
  local ids = redis.call('ZRANGE', p .. 'queue:m:' .. model, 0, depth - 1, 'WITHSCORES')
  for j = 1, #ids, 2 do
    local f = redis.call('HMGET', p .. 'job:' .. ids[j], 'skey', 'srows')
    local rows = tonumber(f[2] or '0')
    if f[1] == skey and rows > 0 and rows <= room then return ids[j], tonumber(ids[j + 1]), rows end
  end
  return nil, nil, nil
end
local best, score, pick, rows = nil, nil, nil, nil
for i = 7, #ARGV, 5 do
  local id, rank, n = first_fit(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]))
  if id and (best == nil or rank < score) and not overtakes(id, ARGV[i + 3]) then
    best, score, pick, rows = id, rank, i, n
  end
end
if best == nil then return {} end
local limit = math.min(tonumber(ARGV[pick + 4]), math.floor(tonumber(ARGV[pick + 2]) / rows))
local f = take_fields(p .. 'job:' .. best)
local ids, fields, bkey = {best}, {f}, f[2] or ''
if bkey ~= '' and limit > 1 then
  local peers = redis.call('ZRANGE', p .. 'queue:b:' .. bkey, 0, limit)
  local kept, more = peers_fields(p, peers, ARGV[pick], bkey, best, limit - 1)
  for i, other in ipairs(kept) do
    table.insert(ids, other)
    table.insert(fields, more[i])
  end
end
local out = {'ok', ARGV[pick], ARGV[pick + 1]}
take(p, ids, asg, owner, now, lease, out, fields)
return out
"""

# The events of running jobs that came from their workers since the last write, for several jobs
# at once (the controller gathers them for a moment: one script instead of one per event). A
# job's events are dropped unless its assignment still holds it. Watchers hear "p ID" (new
# events, not a final state: `wait` sleeps on).
# ARGV: p, then per job: id, assignment, progress ('' = unchanged), worker ('' = unchanged),
#       and its events for log_events (k, last, packed, r). Returns how many jobs' events were
#       logged.
APPEND_MANY = r"""
local p, logged = ARGV[1], 0
for i = 2, #ARGV, 8 do
  local id = ARGV[i]
  local jk = p .. 'job:' .. id
  local f = redis.call('HMGET', jk, 'state', 'assignment')
  if f[1] == 'RUNNING' and f[2] == ARGV[i + 1] then
    if ARGV[i + 2] ~= '' and ARGV[i + 3] ~= '' then
      redis.call('HSET', jk, 'progress', ARGV[i + 2], 'worker', ARGV[i + 3])
    elseif ARGV[i + 2] ~= '' then redis.call('HSET', jk, 'progress', ARGV[i + 2])
    elseif ARGV[i + 3] ~= '' then redis.call('HSET', jk, 'worker', ARGV[i + 3]) end
    log_events(p, id, ARGV[i + 4], ARGV[i + 5], ARGV[i + 6], ARGV[i + 7])
    redis.call('PUBLISH', p .. 'notify', 'p ' .. id)
    logged = logged + 1
  end
end
return logged
"""

# ARGV: p, id, assignment ('' = any), expected states (comma separated), state, now_ms, ttl_s,
#       error, result, worker ('' = unchanged), then the events for log_events (k, last, packed,
#       r: the run's events not logged yet, RESULT, the final state), read_back ('1': answer the
#       job's hash as it is then, for this controller's waiters), then artifact field/value pairs.
# Returns {'missing'}, {'no', STATE} or {'ok', state, owner, assignment, worker it had[, HGETALL]}.
FINISH = r"""
local p, id = ARGV[1], ARGV[2]
local jk = p .. 'job:' .. id
local f = finish_fields(jk)
if not f[1] then return {'missing'} end
if not string.find(',' .. ARGV[4] .. ',', ',' .. f[1] .. ',', 1, true) then return {'no', f[1]} end
if ARGV[3] ~= '' and f[3] ~= ARGV[3] then return {'no', f[1]} end
if #ARGV > 15 then
  local set = {}
  for i = 16, #ARGV do table.insert(set, ARGV[i]) end
  redis.call('HSET', jk, unpack(set))
end
local ev = {ARGV[11], ARGV[12], ARGV[13], ARGV[14]}
local before = finish(p, id, ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ev, f, ARGV[10])
local out = {'ok', before[1], before[2], before[3], before[4]}
if ARGV[15] == '1' then table.insert(out, redis.call('HGETALL', jk)) end
return out
"""

# Put a running job back in the queue (its worker was lost or gave it up), or fail it when its
# attempts are spent. With lease_before > 0 only if its lease expired before that time.
# ARGV: p, id, assignment ('' = any), lease_before_ms, max_attempts, now_ms, ttl_s,
#       queued_event, failed_error, failed_event
REQUEUE = r"""
local p, id = ARGV[1], ARGV[2]
local jk = p .. 'job:' .. id
local f = redis.call('HMGET', jk, 'state', 'assignment', 'attempts', 'model', 'bkey', 'rank', 'priority')
if f[1] ~= 'RUNNING' then
  redis.call('ZREM', p .. 'running', id)
  return {'no', f[1] or 'missing'}
end
if ARGV[3] ~= '' and f[2] ~= ARGV[3] then return {'no', f[1]} end
if tonumber(ARGV[4]) > 0 then
  local lease = redis.call('ZSCORE', p .. 'running', id)
  if lease and tonumber(lease) > tonumber(ARGV[4]) then return {'no', 'renewed'} end
end
if tonumber(f[3]) >= tonumber(ARGV[5]) then
  finish(p, id, 'FAILED', ARGV[6], ARGV[7], ARGV[9], '', {1, ARGV[10], '', ''})
  return {'failed', f[3]}
end
redis.call('ZREM', p .. 'running', id)
redis.call('HSET', jk, 'state', 'QUEUED', 'enqueued_ms', ARGV[6])
redis.call('HDEL', jk, 'assignment', 'owner', 'worker', 'progress')
enqueue(p, id, f[4], f[5], f[6], f[7])
add_event(p, id, ARGV[8])
tell_queued(p)
redis.call('PUBLISH', p .. 'notify', 'e ' .. id)
return {'queued', f[3]}
"""

# Extend the leases of running jobs this controller holds. ARGV: p, owner, expiry_ms, ids...
RENEW = r"""
local p, owner, expiry = ARGV[1], ARGV[2], ARGV[3]
local renewed = 0
for i = 4, #ARGV do
  local f = redis.call('HMGET', p .. 'job:' .. ARGV[i], 'state', 'owner')
  if f[1] == 'RUNNING' and f[2] == owner then
    redis.call('ZADD', p .. 'running', 'XX', expiry, ARGV[i])
    renewed = renewed + 1
  end
end
return renewed
"""
