-- obleth cluster step: one atomic call carries everything one pod has to say.
--
-- A pod batches its pending work (acquires, releases, cancels, confirmations, its
-- heartbeat, a new limit) into one call of this script, so one round trip serves every
-- request that arrived while the previous call was in flight. Every key of a pool shares
-- one hash tag, so the script runs on one Redis Cluster slot. Time is Redis' own clock
-- (TIME), never a pod's.
--
-- KEYS, in order: state leases lmeta tin tq wq wmeta wdl ready:0 ready:1 rmem pods
--   weights caps await asserted members unready lobby computed leader turns idle ttok
--
-- ARGV, written only by gateway/backends/redis/wire.py (`encode`):
--    1 pod id                  2 lease TTL (ms)             3 roll-call fallback (ms)
--    4 notification prefix     5 ceiling for a new pool     6 max queue
--    7 retried: 1 when this call may have run before (its reply was lost)
--    8 probe: 1 to compare Redis' run_id with the pool's (a failover or a restart)
--    9 membership version the pod knows (-1: it knows no roster yet)
--   10 "<epoch> <seq>": the latest the pod saw, or empty
--   11 flags, words among: heartbeat reassert recover leave
--   12 config   13 held leases   14 queued waiters   15 roster   16 new ceiling (-1: none)
--   17 releases 18 cancels       19 confirmations    20 acquires
--   21 deadline on Redis' clock (ms; 0: none): past it the pod has given up waiting
--   22 computed values "<provider> <value>...", from the pod holding the leader lease
--   23 capacity version the pod knows (-1: none yet)
--
-- The sections below, in the order a call runs them: state and epochs, roll calls,
-- membership, tenants, leases, waiters, dispatch, then the call itself.
--
-- Capacity (see docs/cluster.md, "Computed capacity"): the pool's limit is the minimum of
-- the operator's ceiling, which any pod may set, and the values of the computed capacity
-- providers, which only the pod holding the leader lease writes (the lease itself is
-- kept by leader.lua). Each computed value carries the pod that wrote it and when, on
-- Redis' clock; one that nobody has written for two lease TTLs is dropped, since no pod
-- computes it any more.
--
-- Waiters (see docs/configuration.md, "Overflow policies"): max queue bounds the fair
-- queue (wq). An acquire whose action is 'wait' (block) that finds it full waits in the
-- lobby instead, outside the bound, first come first served, and enters the queue as soon
-- as it has room: after grants, cancels, timeouts, drops. Every waiter, in the queue or
-- in the lobby, has its record in wmeta, its deadline in wdl and its count in tq, so
-- deadlines, cancels, retries and heartbeats treat both alike; the lobby is never
-- occupied while the queue has room.
--
-- Roll calls (see docs/cluster.md, "After Redis loses state"): when Redis may count
-- fewer seats than the pods hold (it lost the pool, a failover lost writes, or a pod
-- comes back from its failure mode), nothing new is granted until every pod that may
-- hold seats has re-asserted them. The pods awaited are every pod Redis still sees as
-- live, every pod subscribed to its notification channel (subscriptions survive
-- FLUSHALL), and every pod named in the roster of a pod that re-asserted; a pod leaves
-- the roll call by re-asserting, or by being presumed dead (its known liveness passed and
-- nobody listens on its channel). A fallback deadline closes the roll call regardless.

local S, LEASES, LMETA, TIN, TQ, WQ, WMETA, WDL = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local READY = { [0] = KEYS[9], [1] = KEYS[10] }
local RMEM, PODS, WEIGHTS, CAPS = KEYS[11], KEYS[12], KEYS[13], KEYS[14]
local AWAIT, ASSERTED, MEMBERS, UNREADY = KEYS[15], KEYS[16], KEYS[17], KEYS[18]
local LOBBY = KEYS[19] -- waiter id -> arrival: waiting for room in the full queue
local COMPUTED, LEADER = KEYS[20], KEYS[21] -- provider -> "value|pod|ms"; the lease holder
local TURNS = KEYS[22] -- tenant -> its turn for ties in the ready sets (see rekey)
local IDLE = KEYS[23] -- tenant -> when it went idle, for the last IDLE_TURNS to go idle
local TTOK = KEYS[24] -- tenant -> the token estimates of its leases (see "tokens" below)
-- how many idle tenants keep their turn: gateway/core/turns.py's IDLE_TURNS
local IDLE_TURNS = 10000
local WAITING_RANKS = 1 -- ranks 0 (critical) and 1 (standard) wait; 2 (background) never
-- a pod that knows no other pod cannot bring a roster: a roll call it opens stays open
-- this long, so that pods still reconnecting after a Redis restart are heard
local GRACE_MS = 500

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function matches(text, pattern)
  local list = {}
  for part in string.gmatch(text, pattern) do
    list[#list + 1] = part
  end
  return list
end

-- each section of the call is one argument of space-separated words
local function words(text)
  return matches(text, '%S+')
end

-- a call Redis runs after its pod gave up on it (Redis was frozen with the call in its
-- socket) must change nothing: the pod went on as if it failed, and, in its failure mode,
-- admitted seats that a re-assertion made here would leave uncounted
local deadline = tonumber(ARGV[21])
if deadline > 0 and now > deadline then
  return { 'late', now }
end

local pod = ARGV[1]
local ttl = tonumber(ARGV[2])
local learn_ms = tonumber(ARGV[3])
local channel = ARGV[4]
local init_ceiling = ARGV[5]
local max_queue = tonumber(ARGV[6])
local retried = ARGV[7] == '1'
local probe = ARGV[8] == '1'
local known_mver = tonumber(ARGV[9])
local seen = words(ARGV[10])
local rolls = learn_ms > 0 -- learning_window_s = 0 turns roll calls off

local flags = {}
for _, flag in ipairs(words(ARGV[11])) do
  flags[flag] = true
end

-- stored records are fields joined by '|'
local function split(text)
  return matches(text, '[^|]+')
end

local function new_id()
  return clock[1] .. string.format('%06d', tonumber(clock[2]))
end

-- notifications: collected per pod, one PUBLISH per pod at the end ---------------------

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

local function live_pods()
  return redis.call('ZRANGEBYSCORE', PODS, now, '+inf')
end

local function nudge_others(token)
  for _, other in ipairs(live_pods()) do
    if other ~= pod then notify(other, token) end
  end
end

-- state and epochs ----------------------------------------------------------------------

local function run_id()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
end

local state = redis.call('HMGET', S, 'epoch', 'limit', 'inflight', 'learn_until', 'dweight',
  'dcap', 'capped', 'grace_until', 'mver', 'runid', 'ceiling', 'cver', 'tokens', 'mtok', 'ftok')
local epoch = state[1]
local new_roll = false
local relearn = nil -- why a new epoch starts ('lost', 'seq', 'runid'), for the pods' logs
if not epoch then
  -- Redis lost the pool (restart without persistence, FLUSHALL, failover, eviction), or
  -- this is its first call ever: start a new epoch and drop whatever fragments survived
  redis.call('DEL', LEASES, LMETA, TIN, TQ, WQ, WMETA, WDL, READY[0], READY[1], RMEM,
    WEIGHTS, CAPS, PODS, AWAIT, ASSERTED, MEMBERS, UNREADY, LOBBY, COMPUTED, TURNS, IDLE, TTOK)
  epoch = new_id()
  redis.call('HSET', S, 'limit', init_ceiling, 'inflight', 0, 'epoch', epoch, 'learn_until', 0,
    'grace_until', 0, 'dweight', 1, 'dcap', -1, 'capped', 0, 'seq', 0, 'arr', 0, 'mver', 0,
    'runid', run_id(), 'ceiling', init_ceiling, 'cver', 0, 'tokens', 0, 'mtok', -1, 'ftok', 0)
  state = { epoch, init_ceiling, 0, 0, 1, -1, 0, 0, 0, false, init_ceiling, 0, 0, -1, 0 }
  new_roll = true
  relearn = 'lost'
elseif probe then
  -- the pool was written by another Redis server: a replica promoted by a failover (which
  -- may have missed the last writes) or a restart that reloaded a snapshot
  local current = run_id()
  if state[10] ~= current then
    redis.call('HSET', S, 'runid', current)
    if state[10] then relearn = 'runid' end
  end
end
local seq = redis.call('HINCRBY', S, 'seq', 1)
if not relearn and seen[1] == epoch and tonumber(seen[2]) >= seq then
  -- this pod saw the pool further along than Redis has it: a failover lost writes
  relearn = 'seq'
end
local limit = tonumber(state[2])
local inflight = tonumber(state[3])
local inflight_before = inflight
local learn_until = tonumber(state[4])
local dweight = tonumber(state[5])
local dcap = tonumber(state[6])
local capped = state[7] == '1'
local grace_until = tonumber(state[8] or '0')
local mver = tonumber(state[9] or '0')
-- a pool written before ceilings were kept apart has its limit as its ceiling, kept from
-- now on: the limit may then fall below it
local ceiling = tonumber(state[11] or state[2])
if not state[11] then redis.call('HSET', S, 'ceiling', ceiling) end
local cver = tonumber(state[12] or '0')
-- tokens: with a token budget (mtok >= 0) or fairness by tokens (ftok), as the pods' config
-- says, each lease and waiter carries its request's token estimate; the pool counts the
-- tokens in flight, and per tenant in TTOK. Records from before tokens count none
local tokens_inflight = tonumber(state[13] or '0')
local tokens_before = tokens_inflight
local mtok = tonumber(state[14] or '-1')
local ftok = state[15] == '1'
local known_cver = tonumber(ARGV[23])
-- waiters in the queue and in the lobby, kept up to date below: nothing waits, nothing to do
local nlobby = redis.call('ZCARD', LOBBY)
local nwait = redis.call('HLEN', WMETA) - nlobby
-- how many may wait in the queue before a 'wait' goes to the lobby: with max queue 0 one
-- still waits at the head (a hand-off), else a request under block could never get a seat
local room = math.max(max_queue, 1)

if relearn and relearn ~= 'lost' then
  -- the sequence went backwards, or the run_id changed: what Redis counts may be older
  -- than what runs, as after a loss
  epoch = new_id()
  redis.call('HSET', S, 'epoch', epoch)
  new_roll = true
end

local function add_inflight(delta)
  inflight = inflight + delta
end

-- whether a request of `seats` and `tok` tokens fits: its seats under the limit, its
-- tokens under the budget (one estimated above the whole budget fits once no tokens are
-- in flight: it runs alone rather than never); as gateway/core/fairqueue.py's fits()
local function fits(seats, tok)
  if inflight + seats > limit then return false end
  return mtok < 0 or tokens_inflight == 0 or tokens_inflight + tok <= mtok
end

local function add_tokens(tenant, delta)
  if delta == 0 then return end
  tokens_inflight = tokens_inflight + delta
  if redis.call('HINCRBY', TTOK, tenant, delta) <= 0 then redis.call('HDEL', TTOK, tenant) end
end

-- roll calls -----------------------------------------------------------------------------

local function learning()
  return learn_until > 0
end

local function pod_of_channel(name)
  return string.sub(name, #channel + 1)
end

local function listened(of_pod)
  return redis.call('PUBSUB', 'NUMSUB', channel .. of_pod)[2] > 0
end

-- awaits a pod, keeping the latest liveness known for it; true when it was not awaited
local function await(of_pod, alive_until)
  local known = redis.call('ZSCORE', AWAIT, of_pod)
  if known and tonumber(known) >= tonumber(alive_until) then return false end
  redis.call('ZADD', AWAIT, alive_until, of_pod)
  return not known
end

local function close_roll()
  learn_until, grace_until = 0, 0
  redis.call('HSET', S, 'learn_until', 0, 'grace_until', 0)
  redis.call('DEL', AWAIT)
end

local function start_roll()
  if not rolls then return end
  redis.call('DEL', AWAIT, ASSERTED)
  learn_until = now + learn_ms
  grace_until = 0
  local live = redis.call('ZRANGEBYSCORE', PODS, now, '+inf', 'WITHSCORES')
  for at = 1, #live, 2 do
    await(live[at], live[at + 1])
  end
  local pattern = string.gsub(channel, '([%*%?%[%]\\])', '\\%1') .. '*'
  for _, name in ipairs(redis.call('PUBSUB', 'CHANNELS', pattern)) do
    await(pod_of_channel(name), now)
  end
  await(pod, now + ttl)
  if known_mver < 0 and redis.call('ZCARD', AWAIT) <= 1 then
    grace_until = now + GRACE_MS
  end
  for _, awaited in ipairs(redis.call('ZRANGE', AWAIT, 0, -1)) do
    if awaited ~= pod then notify(awaited, 'e') end
  end
  redis.call('HSET', S, 'learn_until', learn_until, 'grace_until', grace_until)
end

-- a pod may hold seats Redis does not count until it has re-asserted in this roll call;
-- it is heard from, so it is awaited
local function await_caller()
  if learning() and redis.call('SISMEMBER', ASSERTED, pod) == 0 then
    await(pod, now + ttl)
  end
end

-- the roster a re-asserting pod brings: every pod it saw live, with the liveness it saw.
-- A pod coming back from its failure mode was cut off itself: that it heard nothing from
-- the others meanwhile says nothing of their death (they may have admitted on their own
-- all along, and reconnect a moment later), so each is awaited a lease TTL from now
local function merge_roster(roster, cut_off)
  if not learning() then return end
  for at = 1, #roster, 2 do
    local other = roster[at]
    local alive_until = tonumber(roster[at + 1])
    if cut_off and alive_until < now + ttl then alive_until = now + ttl end
    if other ~= pod and redis.call('SISMEMBER', ASSERTED, other) == 0
        and await(other, alive_until) then
      notify(other, 'e')
    end
  end
end

-- closes the roll call once nobody is awaited, or at its fallback deadline
local function settle_roll()
  if not learning() then return end
  if now >= learn_until then
    close_roll()
    return
  end
  -- presumed dead: its liveness passed, and nobody listens on its channel
  for _, awaited in ipairs(redis.call('ZRANGEBYSCORE', AWAIT, '-inf', '(' .. now)) do
    if not listened(awaited) then redis.call('ZREM', AWAIT, awaited) end
  end
  if now >= grace_until and redis.call('ZCARD', AWAIT) == 0 then close_roll() end
end

-- when the roll call may close without anyone re-asserting: pods with waiters call then
local function roll_ms()
  if not learning() then return 0 end
  local next_change = learn_until
  if grace_until > now and grace_until < next_change then next_change = grace_until end
  local first = redis.call('ZRANGEBYSCORE', AWAIT, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if first[2] and tonumber(first[2]) < next_change then next_change = tonumber(first[2]) end
  return math.max(1, next_change - now)
end

-- membership ------------------------------------------------------------------------------
-- Every pod must know every pod that may hold seats, so that its roster is complete if
-- Redis loses the pool: a pod that joins holds no seat until every other live pod has
-- been told of it (MEMBERS: pod -> "<version it joined at> <version it was last told>").

local function member(of_pod)
  local entry = redis.call('HGET', MEMBERS, of_pod)
  if not entry then return 0, 0 end
  local joined_at, told = string.match(entry, '(%d+) (%d+)')
  return tonumber(joined_at), tonumber(told)
end

local function recheck_unready()
  local pending = redis.call('SMEMBERS', UNREADY)
  if #pending == 0 then return end
  local live = live_pods()
  local told = {}
  for _, other in ipairs(live) do
    local _, version = member(other)
    told[other] = version
  end
  for _, joiner in ipairs(pending) do
    local joined_at = member(joiner)
    local ready = true
    for _, other in ipairs(live) do
      if other ~= joiner and told[other] < joined_at then
        ready = false
        break
      end
    end
    if ready then redis.call('SREM', UNREADY, joiner) end
  end
end

local function forget_pod(of_pod)
  redis.call('HDEL', MEMBERS, of_pod)
  redis.call('SREM', ASSERTED, of_pod)
  redis.call('SREM', UNREADY, of_pod)
end

local function membership_changed()
  mver = redis.call('HINCRBY', S, 'mver', 1)
end

local function asserted(of_pod)
  return not rolls or redis.call('SISMEMBER', ASSERTED, of_pod) == 1
end

local function eligible(of_pod)
  return asserted(of_pod) and (not rolls or redis.call('SISMEMBER', UNREADY, of_pod) == 0)
end

local function roster()
  return table.concat(redis.call('ZRANGEBYSCORE', PODS, now, '+inf', 'WITHSCORES'), ' ')
end

-- tenants ---------------------------------------------------------------------------------

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

-- the head of (rank, tenant)'s FIFO: members of WQ are rank|tenant|arrival|id, all at
-- score 0, so a lexicographic range by prefix finds it in O(log n)
local function head(rank, tenant)
  local prefix = rank .. '|' .. tenant .. '|'
  local first = redis.call('ZRANGEBYLEX', WQ, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0, 1)[1]
  if not first then return nil end
  local parts = split(first)
  return parts[4], parts[3]
end

-- a tenant's turn for ties: the order of its last grant, or of its first request when it
-- has had none. With more tenants than seats most hold none and tie; going by the oldest
-- head instead gave a tenant whose requests arrived early seat after seat, while tenants
-- whose heads kept timing out got none. An idle tenant keeps its turn (its only request
-- timed out, say, and it sends another) while it is among the last IDLE_TURNS to go idle
local function next_turn()
  return string.format('%015d', redis.call('HINCRBY', S, 'turn', 1))
end

local function take_turn(tenant)
  redis.call('HSET', TURNS, tenant, next_turn())
end

-- a tenant with no turn (its first request, or idle for long) gets one from now
local function ensure_turn(tenant)
  if redis.call('HEXISTS', TURNS, tenant) == 0 then take_turn(tenant) end
end

local function idle(tenant)
  return tenant_inflight(tenant) == 0 and tenant_queued(tenant) == 0
end

-- IDLE may still list tenants active again since: their turn stays when they leave it
local function note_if_idle(tenant)
  if not idle(tenant) then return end
  redis.call('ZADD', IDLE, redis.call('HINCRBY', S, 'idled', 1), tenant)
  if redis.call('ZCARD', IDLE) > IDLE_TURNS then
    local oldest = redis.call('ZPOPMIN', IDLE)[1]
    if idle(oldest) then redis.call('HDEL', TURNS, oldest) end
  end
end

-- the tenant of an entry of the ready sets, "<turn><arrival>|tenant": what follows the
-- first '|', as in the entries "<arrival>|tenant" of pods from before turns, which may
-- share the pool for a rolling upgrade
local function entry_tenant(entry)
  return string.sub(entry, string.find(entry, '|', 1, true) + 1)
end

-- re-file a tenant in the ready sets after its seats, its queue or its turn changed: the
-- score is (seats in flight + head's seats) / weight (tokens in flight + head's tokens,
-- when fair by tokens), the member starts with the tenant's turn, then the head's arrival
-- (both 15 digits), so equal scores order the oldest turn first
local function rekey(tenant)
  local held
  if ftok then
    held = tonumber(redis.call('HGET', TTOK, tenant) or '0')
  else
    held = tenant_inflight(tenant)
  end
  local w = weight(tenant)
  local turn = redis.call('HGET', TURNS, tenant) or string.rep('0', 15)
  for rank = 0, WAITING_RANKS do
    local field = rank .. '|' .. tenant
    local old = redis.call('HGET', RMEM, field)
    if old then redis.call('ZREM', READY[rank], old) end
    local id, arrival = head(rank, tenant)
    if id then
      local meta = split(redis.call('HGET', WMETA, id))
      local entry = turn .. arrival .. '|' .. tenant
      local cost = tonumber(meta[4])
      -- fair by tokens the head's own estimate does not count (as in fairqueue.py): a
      -- large request would wait for ever behind a backlogged tenant
      if ftok then cost = 0 end
      redis.call('ZADD', READY[rank], (held + cost) / w, entry)
      redis.call('HSET', RMEM, field, entry)
    elseif old then
      redis.call('HDEL', RMEM, field)
    end
  end
end

local function add_tenant_inflight(tenant, delta)
  local left = redis.call('HINCRBY', TIN, tenant, delta)
  if left <= 0 then
    redis.call('HDEL', TIN, tenant)
    note_if_idle(tenant)
  end
  if nwait > 0 and tenant_queued(tenant) > 0 then rekey(tenant) end
end

-- leases ----------------------------------------------------------------------------------

local function pod_expiry(of_pod)
  local expiry = redis.call('ZSCORE', PODS, of_pod)
  if expiry then return tonumber(expiry) end
  return nil
end

-- whether a pod can no longer run what is granted to it: its liveness has passed, or
-- nobody listens on its channel, so it would never hear of the grant (a killed pod's
-- connections close with it; without this its waiters, the oldest in the queue, would
-- take every seat freed until its liveness passed). A live pod whose notification
-- connection was down finds such waiters lost on the heartbeat it sends when it has
-- subscribed again, and queues them again.
local function pod_gone(of_pod)
  local alive_until = pod_expiry(of_pod)
  if alive_until == nil or alive_until < now then return true end
  return of_pod ~= pod and not listened(of_pod)
end

-- returns the lease's expiry: a grant never outlives its pod's liveness. Its record is
-- tenant|seats|tokens|pod (the pod last: a pod's own are found by suffix); records from
-- before tokens are tenant|seats|pod
local function add_lease(id, tenant, seats, of_pod, tok)
  local expiry = now + ttl -- the caller's own liveness was just renewed to the same
  if of_pod ~= pod then
    local alive_until = pod_expiry(of_pod)
    if alive_until and alive_until < expiry then expiry = alive_until end
  end
  redis.call('ZADD', LEASES, expiry, id)
  redis.call('HSET', LMETA, id, tenant .. '|' .. seats .. '|' .. tok .. '|' .. of_pod)
  add_inflight(seats)
  add_tokens(tenant, tok) -- before the seats: their rekey reads it
  add_tenant_inflight(tenant, seats)
  return expiry
end

local function free_lease(id)
  local meta = redis.call('HGET', LMETA, id)
  if not meta then return false end
  local parts = split(meta)
  local seats = tonumber(parts[2])
  redis.call('ZREM', LEASES, id)
  redis.call('HDEL', LMETA, id)
  add_inflight(-seats)
  if #parts >= 4 then add_tokens(parts[1], -tonumber(parts[3])) end
  add_tenant_inflight(parts[1], -seats)
  return true
end

-- waiters ---------------------------------------------------------------------------------

-- records a new waiter of this pod (its record, rank|tenant|arrival|seats|pod|tokens, its
-- deadline and tenant count); returns its arrival, which orders it in the queue and in
-- the lobby
local function record(id, tenant, rank, seats, tok, deadline)
  local arrival = string.format('%015d', redis.call('HINCRBY', S, 'arr', 1))
  redis.call('HSET', WMETA, id,
    rank .. '|' .. tenant .. '|' .. arrival .. '|' .. seats .. '|' .. pod .. '|' .. tok)
  redis.call('ZADD', WDL, deadline, id)
  redis.call('HINCRBY', TQ, tenant, 1)
  ensure_turn(tenant)
  return arrival
end

-- files a recorded waiter in the queue, in arrival order within its (class, tenant)
local function file(id, rank, tenant, arrival)
  redis.call('ZADD', WQ, 0, rank .. '|' .. tenant .. '|' .. arrival .. '|' .. id)
  nwait = nwait + 1
  rekey(tenant)
end

local function enqueue(id, tenant, rank, seats, tok, deadline)
  file(id, rank, tenant, record(id, tenant, rank, seats, tok, deadline))
end

-- the 'wait' action: into the queue while it has room, else into the lobby
local function wait_for_room(id, tenant, rank, seats, tok, deadline)
  local arrival = record(id, tenant, rank, seats, tok, deadline)
  if nlobby == 0 and nwait < room then
    file(id, rank, tenant, arrival)
  else
    redis.call('ZADD', LOBBY, tonumber(arrival), id)
    nlobby = nlobby + 1
  end
end

-- the lobby's oldest enter the queue while it has room
local function fill_from_lobby()
  while nlobby > 0 and nwait < room do
    local id = redis.call('ZPOPMIN', LOBBY)[1]
    nlobby = nlobby - 1
    local parts = split(redis.call('HGET', WMETA, id))
    file(id, parts[1], parts[2], parts[3])
  end
end

-- takes a waiter out of the queue or the lobby; returns its meta parts (rank, tenant,
-- arrival, seats, pod) or nil when it was not waiting. The room it leaves in the queue
-- goes to the lobby with the next fill_from_lobby (an eviction's newcomer takes it first)
local function unqueue(id)
  local meta = redis.call('HGET', WMETA, id)
  if not meta then return nil end
  local parts = split(meta)
  redis.call('HDEL', WMETA, id)
  redis.call('ZREM', WDL, id)
  if redis.call('HINCRBY', TQ, parts[2], -1) <= 0 then
    redis.call('HDEL', TQ, parts[2])
    note_if_idle(parts[2])
  end
  if nlobby > 0 and redis.call('ZREM', LOBBY, id) == 1 then
    nlobby = nlobby - 1
  else
    redis.call('ZREM', WQ, parts[1] .. '|' .. parts[2] .. '|' .. parts[3] .. '|' .. id)
    nwait = nwait - 1
    rekey(parts[2])
  end
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
-- class more urgent than the newcomer's; ties go to the tenant with more waiting, then to
-- the one whose head (in any class it may lose from) arrived first, as in process. The
-- least urgent class of that tenant loses first
local function eviction_victim(rank)
  local best_tenant, best_load, best_queued, best_arrival = nil, nil, nil, nil
  for r = rank, WAITING_RANKS do
    local entries = redis.call('ZRANGE', READY[r], 0, -1)
    for _, entry in ipairs(entries) do
      local tenant = entry_tenant(entry)
      local queued = tenant_queued(tenant)
      local load = (tenant_inflight(tenant) + queued) / weight(tenant)
      local _, arrival = head(r, tenant)
      arrival = tonumber(arrival)
      if best_load == nil or load > best_load or (load == best_load and (queued > best_queued
          or (queued == best_queued and arrival < best_arrival))) then
        best_tenant, best_load, best_queued, best_arrival = tenant, load, queued, arrival
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

-- dispatch: hand free seats to waiters ------------------------------------------------------
-- strict priority across classes, weighted max-min across tenants, FIFO within a tenant,
-- never skipping past a head that does not fit (or whose pod must re-assert first)

local function dispatch()
  fill_from_lobby()
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
    local entry = redis.call('ZRANGE', READY[rank], 0, 0)[1]
    local tenant = entry_tenant(entry)
    local id = head(rank, tenant)
    local meta = split(redis.call('HGET', WMETA, id))
    local seats, of_pod, tok = tonumber(meta[4]), meta[5], tonumber(meta[6] or '0')
    if pod_gone(of_pod) then
      unqueue(id) -- nobody is left to run it (the pod queues it again if it comes back)
    else
      if not fits(seats, tok) or not eligible(of_pod) then return end
      unqueue(id)
      take_turn(tenant)
      local expiry = add_lease(id, tenant, seats, of_pod, tok)
      notify(of_pod, 'g:' .. id .. ':' .. expiry)
    end
    fill_from_lobby()
  end
end

-- the call ----------------------------------------------------------------------------------

if new_roll then start_roll() end
if flags.recover and not learning() then
  -- a pod back from its failure mode may have admitted seats Redis never saw, and so may
  -- every other pod that lost Redis at the same time
  start_roll()
end

-- liveness and membership: a pod Redis did not know (new, or back after its liveness
-- passed) joins, and holds nothing until every live pod has been told of it
local joined = redis.call('ZADD', PODS, now + ttl, pod) == 1
if joined and not flags.leave then
  membership_changed()
  forget_pod(pod)
  redis.call('HSET', MEMBERS, pod, mver .. ' ' .. mver)
  if rolls and #live_pods() > 1 then
    redis.call('SADD', UNREADY, pod)
    nudge_others('m')
  end
end

-- configuration (sent after a pod starts and after a new epoch):
-- "<default weight> <default cap> <n> <tenant> <weight>... <m> <tenant> <cap>...
--  <token budget, -1: none> <fair by tokens, 0 or 1>"
local config = words(ARGV[12])
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
  mtok = tonumber(config[at] or '-1')
  ftok = config[at + 1] == '1'
  redis.call('HSET', S, 'dweight', dweight, 'dcap', dcap, 'capped', capped and 1 or 0,
    'mtok', mtok, 'ftok', ftok and 1 or 0)
end

-- a tenant holding no seat holds no tokens: tokens left to one were counted by a lease
-- that a pod of a version before tokens freed (a rolling upgrade); each heartbeat mends it
local function mend_tokens()
  local kept = redis.call('HKEYS', TTOK)
  for _, tenant in ipairs(kept) do
    if redis.call('HEXISTS', TIN, tenant) == 0 then
      tokens_inflight = tokens_inflight - tonumber(redis.call('HGET', TTOK, tenant))
      redis.call('HDEL', TTOK, tenant)
    end
  end
end

-- heartbeat: renew this pod's leases, re-assert those Redis no longer has, and report
-- waiters granted without the pod hearing of it, or lost
await_caller()
if flags.heartbeat then mend_tokens() end
local reasserted, missed, lost = 0, {}, {}
if flags.heartbeat then
  local held = words(ARGV[13]) -- "<id> <tenant> <seats> <tokens>..."
  local waiters = words(ARGV[14])
  for at = 1, #held, 4 do
    local id, tenant, seats, tok = held[at], held[at + 1], tonumber(held[at + 2]),
      tonumber(held[at + 3])
    if redis.call('ZADD', LEASES, 'XX', 'CH', now + ttl, id) == 0
        and not redis.call('ZSCORE', LEASES, id) then
      -- after Redis lost the pool its holders have no turn: one from now
      ensure_turn(tenant)
      add_lease(id, tenant, seats, pod, tok)
      reasserted = reasserted + 1
    end
  end
  for _, id in ipairs(waiters) do
    if redis.call('HEXISTS', WMETA, id) == 0 then -- else: still waiting
      if redis.call('HEXISTS', LMETA, id) == 1 then
        redis.call('ZADD', LEASES, 'XX', now + ttl, id)
        missed[#missed + 1] = id
      else
        lost[#lost + 1] = id
      end
    end
  end
  if flags.reassert then
    -- what the pod re-asserts is all it holds: a lease of its own that it neither holds
    -- nor waits to hear of was given back where Redis did not see it (a failover lost
    -- the release), and would otherwise keep its seat until it expires
    local keep = {}
    for at = 1, #held, 4 do keep[held[at]] = true end
    for _, id in ipairs(waiters) do keep[id] = true end
    local suffix = '|' .. pod
    local all = redis.call('HGETALL', LMETA)
    for at = 1, #all, 2 do
      local id = all[at]
      if not keep[id] and string.sub(all[at + 1], -#suffix) == suffix then
        free_lease(id)
      end
    end
  end
end
if flags.reassert then
  -- everything this pod holds is counted now (the heartbeat above), and everyone it
  -- knows is awaited. It leaves the roll call, unless it is coming back from its failure
  -- mode: it may admit on its own until it reads this reply, so it answers with its
  -- next call, made once it no longer does
  merge_roster(words(ARGV[15]), flags.recover)
  if not flags.recover then
    redis.call('ZREM', AWAIT, pod)
    redis.call('SADD', ASSERTED, pod)
  end
end

-- capacity: a new ceiling from any pod, computed values from the lease holder only, and
-- the limit they make, the one source of truth (raised, it dispatches below)
local capacity_changed = false
local capacity_read = false
local new_ceiling = tonumber(ARGV[16])
if new_ceiling >= 0 then
  capacity_changed = new_ceiling ~= ceiling
  ceiling = new_ceiling
  redis.call('HSET', S, 'ceiling', ceiling)
  capacity_read = true
end
local computed = words(ARGV[22])
if #computed > 0 then
  -- the lease is taken here too when nobody holds it: after Redis lost it, the pod that
  -- held it writes its values back with its re-assertion, as it does its leases
  local holder = redis.call('GET', LEADER)
  if not holder then
    redis.call('SET', LEADER, pod, 'PX', ttl)
    holder = pod
  end
  if holder == pod then
    for at = 1, #computed, 2 do
      local name, value = computed[at], computed[at + 1]
      local before = redis.call('HGET', COMPUTED, name)
      local old = before and split(before) or {}
      if old[1] ~= value or old[2] ~= pod then capacity_changed = true end
      redis.call('HSET', COMPUTED, name, value .. '|' .. pod .. '|' .. now)
    end
  end
  capacity_read = true
end
-- read back with every heartbeat, and whenever the pod's version is behind; a computed
-- value nobody wrote for two lease TTLs is dropped (no pod computes it any more)
local capacity_text = '' -- "<ceiling> <provider> <value> <pod> <ms>..."
if capacity_read or flags.heartbeat or known_cver ~= cver then
  local lowest = ceiling
  local parts = { tostring(ceiling) }
  local all = redis.call('HGETALL', COMPUTED)
  for at = 1, #all, 2 do
    local entry = split(all[at + 1])
    if now - tonumber(entry[3]) > 2 * ttl then
      redis.call('HDEL', COMPUTED, all[at])
      capacity_changed = true
    else
      lowest = math.min(lowest, tonumber(entry[1]))
      parts[#parts + 1] = all[at] .. ' ' .. entry[1] .. ' ' .. entry[2] .. ' ' .. entry[3]
    end
  end
  capacity_text = table.concat(parts, ' ')
  if lowest ~= limit then
    limit = lowest
    redis.call('HSET', S, 'limit', limit)
    capacity_changed = true
  end
end
if capacity_changed then cver = redis.call('HINCRBY', S, 'cver', 1) end

-- reap expired leases (a pod that stopped renewing) and expired waiters, then dead pods
for _, id in ipairs(redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, 256)) do
  free_lease(id)
end
if nwait + nlobby > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', WDL, '-inf', now, 'LIMIT', 0, 256)) do
    drop(id, 'queue_timeout')
  end
end
local dead = redis.call('ZRANGEBYSCORE', PODS, '-inf', '(' .. now)
if #dead > 0 then
  for _, gone in ipairs(dead) do
    redis.call('ZREM', PODS, gone)
    forget_pod(gone)
  end
  membership_changed()
  recheck_unready()
end

if flags.leave then
  -- a pod shutting down: the others drop it from their rosters
  redis.call('ZREM', PODS, pod)
  redis.call('ZREM', AWAIT, pod)
  forget_pod(pod)
  membership_changed()
  nudge_others('m')
end

-- the pod is told the roster when its version is behind, and with every heartbeat (the
-- liveness it lists is then at most one heartbeat old)
local told_roster = flags.heartbeat or known_mver ~= mver
if told_roster and not flags.leave then
  local joined_at = member(pod)
  redis.call('HSET', MEMBERS, pod, joined_at .. ' ' .. mver)
end
recheck_unready()
settle_roll()

-- releases never fail: a lease Redis no longer has was already given back
for _, id in ipairs(words(ARGV[17])) do
  free_lease(id)
end

-- cancels: 'c' taken out of the queue, 'r' a grant had won the race and is given back
-- now, '-' neither (already dropped)
local cancelled = {}
for n, id in ipairs(words(ARGV[18])) do
  if unqueue(id) then
    cancelled[n] = 'c'
  elseif free_lease(id) then
    cancelled[n] = 'r'
  else
    cancelled[n] = '-'
  end
end

-- confirmations of grants the pod read too late to trust: 'y' the lease still holds (and
-- is renewed), 'n' it expired and its seats went to others
local confirmed = {}
for n, id in ipairs(words(ARGV[19])) do
  if redis.call('HEXISTS', LMETA, id) == 1 then
    redis.call('ZADD', LEASES, 'XX', now + ttl, id)
    confirmed[n] = 'y'
  else
    confirmed[n] = 'n'
  end
end

-- the room timeouts and cancels left in the queue goes to the lobby before newcomers
fill_from_lobby()

-- acquires, "<id> <tenant> <rank> <seats> <tokens> <action> <wait ms>...": answered 'g' granted,
-- 'q' waiting (in the queue or the lobby), else the reason of the refusal. The action is
-- the overflow policy's when no seat is free: 'wait' waits in the queue, or in the lobby
-- while the queue is full; 'queue' waits in the queue, refused when it is full; 'evict'
-- makes room by evicting; 'reject' never waits. Action 'requeue' is a waiter Redis
-- dropped while its pod was away, queued again whatever the bound.
local caller_asserted = asserted(pod)
local caller_eligible = caller_asserted
  and (not rolls or redis.call('SISMEMBER', UNREADY, pod) == 0)
local answers = {}
local acquires = words(ARGV[20])
for at = 1, #acquires, 7 do
  local id, tenant, rank, seats, tok, action, wait_ms = acquires[at], acquires[at + 1],
    tonumber(acquires[at + 2]), tonumber(acquires[at + 3]), tonumber(acquires[at + 4]),
    acquires[at + 5], tonumber(acquires[at + 6])
  local answer
  if retried and redis.call('HEXISTS', LMETA, id) == 1 then
    answer = 'g' -- a retry of a call whose reply was lost
  elseif retried and redis.call('HEXISTS', WMETA, id) == 1 then
    answer = 'q'
  else
    local cap = dcap
    if capped then cap = tonumber(redis.call('HGET', CAPS, tenant) or dcap) end
    if action ~= 'requeue' and cap >= 0
        and tenant_inflight(tenant) + tenant_queued(tenant) + seats > cap then
      answer = 'tenant_limit'
    elseif not learning() and caller_eligible and fits(seats, tok)
        and not waiting_at_or_above(rank) then
      take_turn(tenant)
      add_lease(id, tenant, seats, pod, tok)
      answer = 'g'
    elseif rank > WAITING_RANKS then
      answer = 'no_wait'
    elseif action == 'requeue' then
      enqueue(id, tenant, rank, seats, tok, now + wait_ms)
      answer = 'q'
    elseif action == 'wait' then
      wait_for_room(id, tenant, rank, seats, tok, now + wait_ms)
      answer = 'q'
    else
      local full = nwait >= max_queue
      if action == 'reject' then
        -- queue_full only when waiters fill it (max_queue 0 leaves no queue to be full)
        if full and nwait > 0 then answer = 'queue_full' else answer = 'over_capacity' end
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
          enqueue(id, tenant, rank, seats, tok, now + wait_ms)
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
if inflight == 0 and tokens_inflight ~= 0 then
  -- nothing in flight holds no tokens (see add_tenant_inflight)
  tokens_inflight = 0
  redis.call('DEL', TTOK)
end
if tokens_inflight ~= tokens_before then redis.call('HSET', S, 'tokens', tokens_inflight) end

local roster_text = ''
if told_roster then roster_text = roster() end
return {
  limit, inflight, nwait, epoch, seq, redis.call('ZCOUNT', PODS, now, '+inf'), roll_ms(),
  table.concat(answers, ' '), table.concat(cancelled, ' '), reasserted,
  table.concat(missed, ' '), table.concat(lost, ' '), table.concat(own_notes, ' '),
  now, mver, told_roster and 1 or 0, roster_text,
  caller_asserted and 1 or 0,
  table.concat(confirmed, ' '), relearn or '', cver, capacity_text, tokens_inflight,
}
