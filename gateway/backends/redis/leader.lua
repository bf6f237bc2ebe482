-- obleth leader lease: which pod of a pool computes the computed capacity providers.
--
-- KEYS[1]: obleth:{<pool>}:leader, holding the holder's pod id, with a TTL on Redis' own
-- clock (never a pod's).
-- ARGV: 1 pod id   2 lease TTL (ms)   3 'hold' or 'resign'
--
-- hold: take the lease if nobody holds it (as SET NX PX), renew it if the caller holds
-- it, and leave it alone otherwise. resign: give it up if the caller holds it.
-- Answers { holder or '', its lease's remaining ms (0: none) }.

local key, pod, ttl = KEYS[1], ARGV[1], tonumber(ARGV[2])
local holder = redis.call('GET', KEYS[1])
if ARGV[3] == 'resign' then
  if holder == pod then redis.call('DEL', key) end
  return { '', 0 }
end
if not holder then
  redis.call('SET', key, pod, 'PX', ttl)
  holder = pod
elseif holder == pod then
  redis.call('PEXPIRE', key, ttl)
end
return { holder, math.max(redis.call('PTTL', key), 0) }
