-- One pod's report to the others: its requests in flight per upstream and the prefixes it
-- placed since its last report. Answered with every other live pod's counts and with the
-- placements recorded since this pod last asked (its own included, in record order).
-- Atomic, so a pod never reads a half-written report.
--
-- KEYS[1]  sorted set: pod id -> expiry (ms, Redis clock)
-- KEYS[2]  hash of this pod's counts: upstream -> requests in flight
-- KEYS[3]  list: the placement record, oldest first ("key upstream blocks")
-- KEYS[4]  string: how many placements were ever recorded (the last entry's number)
-- ARGV[1]  this pod's id
-- ARGV[2]  how long a report lives without a renewal (ms)
-- ARGV[3]  key prefix of the pods' hashes (same hash tag as KEYS[1])
-- ARGV[4]  the number of the last placement this pod has read (0: none)
-- ARGV[5]  how many placements the record keeps
-- ARGV[6]  how long the record lives once no pod reports (ms)
-- ARGV[7]  n, how many upstream counts follow
-- ARGV[8 .. 7+2n]  upstream, count, … (only counts above zero)
-- ARGV[8+2n …]     placements made by this pod, oldest first
-- Reply: {number of the last placement, {placements after ARGV[4]}, {upstream, count, …
-- over the other live pods (an upstream may repeat)}}
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[7])
redis.call('DEL', KEYS[2])
if n > 0 then
  redis.call('HSET', KEYS[2], unpack(ARGV, 8, 7 + 2 * n))
end
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local first_new = 8 + 2 * n
local last = tonumber(redis.call('GET', KEYS[4]) or '0')
if #ARGV >= first_new then
  redis.call('RPUSH', KEYS[3], unpack(ARGV, first_new))
  last = redis.call('INCRBY', KEYS[4], #ARGV - first_new + 1)
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[5]), -1)
end
if last > 0 then
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6]))
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[6]))
end
local seen = tonumber(ARGV[4])
if seen > last then
  seen = 0 -- the record was lost (Redis restarted empty): read it from its start
end
local kept = redis.call('LLEN', KEYS[3])
local start = math.max(0, seen - last + kept)
local learned = {}
if start < kept then
  learned = redis.call('LRANGE', KEYS[3], start, -1)
end

local counts = {}
for _, pod in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if pod ~= ARGV[1] then
    local theirs = redis.call('HGETALL', ARGV[3] .. pod)
    for i = 1, #theirs do
      counts[#counts + 1] = theirs[i]
    end
  end
end
return {last, learned, counts}
