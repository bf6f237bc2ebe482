-- One pod's report of its requests in flight per upstream, answered with every other
-- live pod's. Atomic, so a pod never reads a half-written report.
--
-- KEYS[1]  sorted set: pod id -> expiry (ms, Redis clock)
-- KEYS[2]  hash of this pod's counts: upstream -> requests in flight
-- ARGV[1]  this pod's id
-- ARGV[2]  how long the report lives without a renewal (ms)
-- ARGV[3]  key prefix of the pods' hashes (same hash tag as KEYS[1])
-- ARGV[4…] upstream, count, upstream, count, … (only counts above zero)
-- Reply: flat list upstream, count, … over the other live pods (an upstream may repeat).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('DEL', KEYS[2])
if #ARGV > 4 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 4))
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local reply = {}
for _, pod in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if pod ~= ARGV[1] then
    local counts = redis.call('HGETALL', ARGV[3] .. pod)
    for i = 1, #counts do
      reply[#reply + 1] = counts[i]
    end
  end
end
return reply
