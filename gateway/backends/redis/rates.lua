-- obleth rate budgets: one tenant's requests and tokens per minute, shared by a pool.
--
-- KEYS[1]: obleth:{<pool>}:rate:<escaped tenant>, a hash of two times in ms of Redis' own
-- clock: 'r' for the request budget, 't' for the token budget (see gateway/core/rates.py,
-- which computes the same in one process: a GCRA over one minute).
-- ARGV: 1 'reserve' or 'refund'   2 requests per minute (0: no budget)
--       3 tokens per minute (0: no budget)   4 the request's tokens
--
-- reserve: take one request and the tokens from both budgets, or nothing. Answers {0}
-- when taken; else {1 (requests) or 2 (tokens), ms until it would fit, -1 for never}.
-- refund: give a reservation back, never crediting time before now. Answers {0}.
-- The key expires when both budgets are whole again, so idle tenants cost no memory.

local WINDOW = 60000
local key, op = KEYS[1], ARGV[1]
local rpm, tpm, tokens = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local tats = redis.call('HMGET', key, 'r', 't')
local r_tat = math.max(tonumber(tats[1]) or now, now)
local t_tat = math.max(tonumber(tats[2]) or now, now)

if op == 'refund' then
  if tats[1] == false and tats[2] == false then return { 0 } end
  if rpm > 0 then r_tat = math.max(now, r_tat - WINDOW / rpm) end
  if tpm > 0 then t_tat = math.max(now, t_tat - tokens * WINDOW / tpm) end
else
  if rpm > 0 then
    local after = r_tat + WINDOW / rpm
    if after - now > WINDOW then return { 1, math.ceil(after - now - WINDOW) } end
    r_tat = after
  end
  if tpm > 0 then
    if tokens > tpm then return { 2, -1 } end
    local after = t_tat + tokens * WINDOW / tpm
    if after - now > WINDOW then return { 2, math.ceil(after - now - WINDOW) } end
    t_tat = after
  end
end

local left = math.max(r_tat, t_tat) - now
if left <= 0 then
  redis.call('DEL', key)
else
  redis.call('HSET', key, 'r', string.format('%.3f', r_tat), 't', string.format('%.3f', t_tat))
  redis.call('PEXPIRE', key, math.ceil(left) + 1000)
end
return { 0 }
