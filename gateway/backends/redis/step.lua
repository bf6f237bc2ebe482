-- obleth cluster step: one atomic call carries everything one pod has to say.
--
-- A pod batches its pending work (acquires, releases, cancels, a heartbeat, a new limit)
-- into one call of this script, so one round trip serves every request that arrived
-- while the previous call was in flight. Every key of a pool shares one hash tag, so the
-- script runs on one Redis Cluster slot. Time is Redis' own clock (TIME), never a pod's.
--
-- KEYS: state leases lmeta tin tq wq wmeta wdl ready0 ready1 rmem pods weights caps
-- ARGV: see parse order below; the Python side (gateway/backends/redis/wire.py) is the
-- only writer of this layout.

local S, LEASES, LMETA, TIN, TQ, WQ, WMETA, WDL = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local READY = { [0] = KEYS[9], [1] = KEYS[10] }
local RMEM, PODS, WEIGHTS, CAPS = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local WAITING_RANKS = 1 -- ranks 0 (critical) and 1 (standard) wait; 2 (background) never

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local pod = ARGV[1]
local ttl = tonumber(ARGV[2])
local learn_ms = tonumber(ARGV[3])
local channel = ARGV[4]
local init_limit = ARGV[5]
local max_queue = tonumber(ARGV[6])
local retried = ARGV[7] == '1' -- this call may have run before (its reply was lost)

-- each section of the call is one argument of space-separated words
local function words(text)
  local list = {}
  for word in string.gmatch(text, '%S+') do
    list[#list + 1] = word
  end
  return list
end

-- state ------------------------------------------------------------------------------

local state = redis.call('HMGET', S, 'epoch', 'limit', 'inflight', 'learn_until', 'dweight',
  'dcap', 'capped')
local epoch = state[1]
if not epoch then
  -- Redis lost the pool (restart without persistence, FLUSHALL, failover, eviction):
  -- start a new epoch, drop whatever fragments survived, and grant nothing new until
  -- the pods have had time to re-assert what they hold.
  redis.call('DEL', LEASES, LMETA, TIN, TQ, WQ, WMETA, WDL, READY[0], READY[1], RMEM,
    WEIGHTS, CAPS)
  epoch = clock[1] .. string.format('%06d', tonumber(clock[2]))
  redis.call('HSET', S, 'limit', init_limit, 'inflight', 0, 'epoch', epoch,
    'learn_until', now + learn_ms, 'dweight', 1, 'dcap', -1, 'capped', 0, 'seq', 0, 'arr', 0)
  state = { epoch, init_limit, 0, now + learn_ms, 1, -1, 0 }
end
local seq = redis.call('HINCRBY', S, 'seq', 1)
local limit = tonumber(state[2])
local inflight = tonumber(state[3])
local inflight_before = inflight
local learn_until = tonumber(state[4])
local dweight = tonumber(state[5])
local dcap = tonumber(state[6])
local capped = state[7] == '1'
local nwait = redis.call('HLEN', WMETA) -- kept up to date below: nothing waits, nothing to do

local function add_inflight(delta)
  inflight = inflight + delta
end

-- notifications: collected per pod, one PUBLISH per pod at the end --------------------

local notes = {}
local own_notes = {}
local function notify(to_pod, token)
  if to_pod == pod then
    own_notes[#own_notes + 1] = token
    return
  end
  local list = notes[to_pod]
  if not list then
    list = {}
    notes[to_pod] = list
  end
  list[#list + 1] = token
end

-- tenants ----------------------------------------------------------------------------

local function weight(tenant)
  local w = redis.call('HGET', WEIGHTS, tenant)
  if w then return tonumber(w) end
  return dweight
end

local function tenant_inflight(tenant)
  return tonumber(redis.call('HGET', TIN, tenant) or '0')
end

local function tenant_queued(tenant)
  return tonumber(redis.call('HGET', TQ, tenant) or '0')
end

local function split(text)
  local parts = {}
  for part in string.gmatch(text, '[^|]+') do
    parts[#parts + 1] = part
  end
  return parts
end

-- the head of (rank, tenant)'s FIFO: members of WQ are rank|tenant|arrival|id, all at
-- score 0, so a lexicographic range by prefix finds it in O(log n)
local function head(rank, tenant)
  local prefix = rank .. '|' .. tenant .. '|'
  local first = redis.call('ZRANGEBYLEX', WQ, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0, 1)[1]
  if not first then return nil end
  local parts = split(first)
  return parts[4], parts[3]
end

-- re-file a tenant in the ready sets after its seats or its queue changed: the score is
-- (seats in flight + head's seats) / weight, the member starts with the head's arrival,
-- so equal scores order oldest head first
local function rekey(tenant)
  local held = tenant_inflight(tenant)
  local w = weight(tenant)
  for rank = 0, WAITING_RANKS do
    local field = rank .. '|' .. tenant
    local old = redis.call('HGET', RMEM, field)
    if old then redis.call('ZREM', READY[rank], old) end
    local id, arrival = head(rank, tenant)
    if id then
      local meta = split(redis.call('HGET', WMETA, id))
      local member = arrival .. '|' .. tenant
      redis.call('ZADD', READY[rank], (held + tonumber(meta[4])) / w, member)
      redis.call('HSET', RMEM, field, member)
    elseif old then
      redis.call('HDEL', RMEM, field)
    end
  end
end

local function add_tenant_inflight(tenant, delta)
  local left = redis.call('HINCRBY', TIN, tenant, delta)
  if left <= 0 then redis.call('HDEL', TIN, tenant) end
  if nwait > 0 and tenant_queued(tenant) > 0 then rekey(tenant) end
end

-- leases -----------------------------------------------------------------------------

local function pod_expiry(of_pod)
  local expiry = redis.call('ZSCORE', PODS, of_pod)
  if expiry then return tonumber(expiry) end
  return nil
end

local function add_lease(id, tenant, seats, of_pod)
  local expiry = now + ttl -- the caller's own liveness was just renewed to the same
  if of_pod ~= pod then
    local alive_until = pod_expiry(of_pod)
    if alive_until and alive_until < expiry then expiry = alive_until end
  end
  redis.call('ZADD', LEASES, expiry, id)
  redis.call('HSET', LMETA, id, tenant .. '|' .. seats .. '|' .. of_pod)
  add_inflight(seats)
  add_tenant_inflight(tenant, seats)
end

local function free_lease(id)
  local meta = redis.call('HGET', LMETA, id)
  if not meta then return false end
  local parts = split(meta)
  local seats = tonumber(parts[2])
  redis.call('ZREM', LEASES, id)
  redis.call('HDEL', LMETA, id)
  add_inflight(-seats)
  add_tenant_inflight(parts[1], -seats)
  return true
end

-- waiters ----------------------------------------------------------------------------

local function enqueue(id, tenant, rank, seats, deadline)
  local arrival = string.format('%015d', redis.call('HINCRBY', S, 'arr', 1))
  redis.call('ZADD', WQ, 0, rank .. '|' .. tenant .. '|' .. arrival .. '|' .. id)
  redis.call('HSET', WMETA, id, rank .. '|' .. tenant .. '|' .. arrival .. '|' .. seats .. '|' .. pod)
  redis.call('ZADD', WDL, deadline, id)
  redis.call('HINCRBY', TQ, tenant, 1)
  nwait = nwait + 1
  rekey(tenant)
end

-- takes a waiter out of the queue; returns its meta parts (rank, tenant, arrival, seats,
-- pod) or nil when it was not waiting
local function unqueue(id)
  local meta = redis.call('HGET', WMETA, id)
  if not meta then return nil end
  local parts = split(meta)
  redis.call('ZREM', WQ, parts[1] .. '|' .. parts[2] .. '|' .. parts[3] .. '|' .. id)
  redis.call('HDEL', WMETA, id)
  redis.call('ZREM', WDL, id)
  if redis.call('HINCRBY', TQ, parts[2], -1) <= 0 then redis.call('HDEL', TQ, parts[2]) end
  nwait = nwait - 1
  rekey(parts[2])
  return parts
end

local function drop(id, reason)
  local parts = unqueue(id)
  if parts then notify(parts[5], 'x:' .. reason .. ':' .. id) end
end

local function waiting_at_or_above(rank)
  if nwait == 0 then return false end
  for r = 0, math.min(rank, WAITING_RANKS) do
    if redis.call('ZCARD', READY[r]) > 0 then return true end
  end
  return false
end

-- the oldest waiter of the heaviest tenant ((in flight + queued) / weight), never from a
-- class more urgent than the newcomer's; the least urgent class of that tenant loses first
local function eviction_victim(rank)
  local best_tenant, best_load, best_queued = nil, nil, nil
  for r = rank, WAITING_RANKS do
    local members = redis.call('ZRANGE', READY[r], 0, -1)
    for _, member in ipairs(members) do
      local tenant = string.sub(member, string.find(member, '|', 1, true) + 1)
      local queued = tenant_queued(tenant)
      local load = (tenant_inflight(tenant) + queued) / weight(tenant)
      if best_load == nil or load > best_load or (load == best_load and queued > best_queued) then
        best_tenant, best_load, best_queued = tenant, load, queued
      end
    end
  end
  if not best_tenant then return nil end
  for r = WAITING_RANKS, rank, -1 do
    local id = head(r, best_tenant)
    if id then return id end
  end
  return nil
end

local function learning()
  return now < learn_until
end

-- hand free seats to waiters: strict priority across classes, weighted max-min across
-- tenants, FIFO within a tenant, never skipping past a head that does not fit
local function dispatch()
  if nwait == 0 or learning() then return end
  for _ = 1, 100000 do
    local rank = nil
    for r = 0, WAITING_RANKS do
      if redis.call('ZCARD', READY[r]) > 0 then
        rank = r
        break
      end
    end
    if rank == nil then return end
    local member = redis.call('ZRANGE', READY[rank], 0, 0)[1]
    local tenant = string.sub(member, string.find(member, '|', 1, true) + 1)
    local id = head(rank, tenant)
    local meta = split(redis.call('HGET', WMETA, id))
    local seats, of_pod = tonumber(meta[4]), meta[5]
    local alive_until = pod_expiry(of_pod)
    if alive_until == nil or alive_until < now then
      unqueue(id) -- its pod is gone: nobody is left to run it
    else
      if inflight + seats > limit then return end
      unqueue(id)
      add_lease(id, tenant, seats, of_pod)
      notify(of_pod, 'g:' .. id)
    end
  end
end

-- the call ---------------------------------------------------------------------------

redis.call('ZADD', PODS, now + ttl, pod)

-- configuration (sent after a pod starts and after a new epoch):
-- "<default weight> <default cap> <n> <tenant> <weight>... <m> <tenant> <cap>..."
local config = words(ARGV[8])
if #config > 0 then
  dweight, dcap = tonumber(config[1]), tonumber(config[2])
  redis.call('DEL', WEIGHTS, CAPS)
  local at = 4
  for _ = 1, tonumber(config[3]) do
    redis.call('HSET', WEIGHTS, config[at], config[at + 1])
    at = at + 2
  end
  local ncaps = tonumber(config[at])
  at = at + 1
  for _ = 1, ncaps do
    redis.call('HSET', CAPS, config[at], config[at + 1])
    at = at + 2
  end
  capped = dcap >= 0 or ncaps > 0
  redis.call('HSET', S, 'dweight', dweight, 'dcap', dcap, 'capped', capped and 1 or 0)
end

-- a pod saw the sequence go backwards (a failover lost writes): new epoch, learn again
if ARGV[9] == '1' then
  epoch = clock[1] .. string.format('%06d', tonumber(clock[2]))
  learn_until = now + learn_ms
  redis.call('HSET', S, 'epoch', epoch, 'learn_until', learn_until)
end

-- heartbeat: renew this pod's leases, re-assert those Redis no longer has, and report
-- waiters granted without the pod hearing of it, or lost
local reasserted, missed, lost = 0, {}, {}
if ARGV[10] == '1' then
  local held = words(ARGV[11]) -- "<id> <tenant> <seats>..."
  for at = 1, #held, 3 do
    local id, tenant, seats = held[at], held[at + 1], tonumber(held[at + 2])
    if redis.call('ZADD', LEASES, 'XX', 'CH', now + ttl, id) == 0
        and not redis.call('ZSCORE', LEASES, id) then
      add_lease(id, tenant, seats, pod)
      reasserted = reasserted + 1
    end
  end
  for _, id in ipairs(words(ARGV[12])) do
    if redis.call('HEXISTS', WMETA, id) == 0 then -- else: still waiting
      if redis.call('HEXISTS', LMETA, id) == 1 then
        redis.call('ZADD', LEASES, 'XX', now + ttl, id)
        missed[#missed + 1] = id
      else
        lost[#lost + 1] = id
      end
    end
  end
end

-- a new limit, from any pod: the one source of truth
local new_limit = tonumber(ARGV[13])
if new_limit >= 0 then
  limit = new_limit
  redis.call('HSET', S, 'limit', limit)
end

-- reap expired leases (a pod that stopped renewing) and expired waiters, then dead pods
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, 256)) do
  free_lease(id)
end
if nwait > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WDL, '-inf', now, 'LIMIT', 0, 256)) do
    drop(id, 'queue_timeout')
  end
end
redis.call('ZREMRANGEBYSCORE', PODS, '-inf', now - 1)

-- releases never fail: a lease Redis no longer has was already given back
for _, id in ipairs(words(ARGV[14])) do
  free_lease(id)
end

-- cancels: 'c' taken out of the queue, 'r' a grant had won the race and is given back
-- now, '-' neither (already dropped)
local cancelled = {}
for n, id in ipairs(words(ARGV[15])) do
  if unqueue(id) then
    cancelled[n] = 'c'
  elseif free_lease(id) then
    cancelled[n] = 'r'
  else
    cancelled[n] = '-'
  end
end

-- acquires, "<id> <tenant> <rank> <seats> <action> <wait ms>...": answered 'g' granted,
-- 'q' queued, else the reason of the refusal
local answers = {}
local acquires = words(ARGV[16])
for at = 1, #acquires, 6 do
  local id, tenant, rank, seats, action, wait_ms = acquires[at], acquires[at + 1],
    tonumber(acquires[at + 2]), tonumber(acquires[at + 3]), acquires[at + 4],
    tonumber(acquires[at + 5])
  local answer
  if retried and redis.call('HEXISTS', LMETA, id) == 1 then
    answer = 'g' -- a retry of a call whose reply was lost
  elseif retried and redis.call('HEXISTS', WMETA, id) == 1 then
    answer = 'q'
  else
    local cap = dcap
    if capped then cap = tonumber(redis.call('HGET', CAPS, tenant) or dcap) end
    if cap >= 0 and tenant_inflight(tenant) + tenant_queued(tenant) + seats > cap then
      answer = 'tenant_limit'
    elseif not learning() and inflight + seats <= limit and not waiting_at_or_above(rank) then
      add_lease(id, tenant, seats, pod)
      answer = 'g'
    elseif rank > WAITING_RANKS then
      answer = 'no_wait'
    else
      local full = nwait >= max_queue
      if action == 'reject' then
        if full then answer = 'queue_full' else answer = 'over_capacity' end
      elseif full and action ~= 'evict' then
        answer = 'queue_full'
      else
        if full then
          local victim = eviction_victim(rank)
          if victim then drop(victim, 'evicted') end
          full = victim == nil
        end
        if full then
          answer = 'queue_full'
        else
          enqueue(id, tenant, rank, seats, now + wait_ms)
          answer = 'q'
        end
      end
    end
  end
  answers[#answers + 1] = answer
end

dispatch()

for to_pod, list in pairs(notes) do
  redis.call('PUBLISH', channel .. to_pod, table.concat(list, ' '))
end

if inflight ~= inflight_before then redis.call('HSET', S, 'inflight', inflight) end

local learning_ms = 0
if learning() then learning_ms = learn_until - now end
return {
  limit, inflight, nwait, epoch, seq, redis.call('ZCOUNT', PODS, now, '+inf'), learning_ms,
  table.concat(answers, ' '), table.concat(cancelled, ' '), reasserted,
  table.concat(missed, ' '), table.concat(lost, ' '), table.concat(own_notes, ' '),
}
