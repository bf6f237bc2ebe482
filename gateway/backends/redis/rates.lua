-- obleth rate budgets: tenants' requests and tokens per minute, shared by a pool.
--
-- One call carries a batch of operations, one per key: KEYS[i] is
-- obleth:{<pool>}:rate:<escaped tenant>, and ARGV holds four words per operation:
--   'reserve', 'refund' or 'charge', requests per minute (0: no budget, or for 'refund'
--   keep the request counted), tokens per minute (0: no budget), the request's tokens.
-- Each budget is a GCRA over one minute, as gateway/core/rates.py computes it in one
-- process. The hash keeps, per budget ('r' requests, 't' tokens), how long until what it
-- reserved is earned back, in ms as of 'at' (Redis' clock, ms): times relative to the
-- moment they were written, so that a tiny cost (a token of a budget of 10^9 a minute is
-- 60 ns) is not lost in the digits of an absolute time.
--
-- reserve: take one request and the tokens from both budgets, or nothing. Answers 0 and
-- 0 when taken; else 1 (requests) or 2 (tokens), and the ms until both would have room:
-- the longer wait, -1 when the tokens exceed the whole budget (they never fit).
-- refund: give a reservation back, never crediting time before now. Answers 0 and 0.
-- charge: take tokens whatever the room, at most a minute's budget (a served request used
-- more than it reserved). Answers 0 and 0.
-- A key expires when both budgets are whole again, so idle tenants cost no memory.

local WINDOW = 60000
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local answers = {}

for i, key in ipairs(KEYS) do
  local at = 4 * (i - 1)
  local op, rpm, tpm = ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local tokens = tonumber(ARGV[at + 4])
  local kept = redis.call('HMGET', key, 'r', 't', 'at')
  local since = now - (tonumber(kept[3]) or now)
  -- what each budget still owes, as of now (0: whole)
  local r_owed = math.max((tonumber(kept[1]) or 0) - since, 0)
  local t_owed = math.max((tonumber(kept[2]) or 0) - since, 0)
  local code, wait = 0, 0
  if op == 'refund' then
    if rpm > 0 then r_owed = math.max(r_owed - WINDOW / rpm, 0) end
    if tpm > 0 then t_owed = math.max(t_owed - tokens * WINDOW / tpm, 0) end
  elseif op == 'charge' then
    if tpm > 0 then t_owed = t_owed + math.min(tokens, tpm) * WINDOW / tpm end
  else
    local r_after, t_after = r_owed, t_owed
    if rpm > 0 then r_after = r_owed + WINDOW / rpm end
    if tpm > 0 then t_after = t_owed + tokens * WINDOW / tpm end
    if tpm > 0 and tokens > tpm then
      code, wait = 2, -1
    elseif r_after > WINDOW or t_after > WINDOW then
      local r_wait, t_wait = math.max(r_after - WINDOW, 0), math.max(t_after - WINDOW, 0)
      if t_wait > r_wait then code, wait = 2, t_wait else code, wait = 1, r_wait end
      wait = math.ceil(wait)
    else
      r_owed, t_owed = r_after, t_after
    end
  end
  if code == 0 then
    local left = math.max(r_owed, t_owed)
    if left <= 0 then
      redis.call('DEL', key)
    else
      redis.call('HSET', key, 'r', r_owed, 't', t_owed, 'at', string.format('%.3f', now))
      redis.call('PEXPIRE', key, math.ceil(left) + 1000)
    end
  end
  answers[#answers + 1] = code
  answers[#answers + 1] = wait
end
return answers
