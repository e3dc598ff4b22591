-- Read a countdown latch's count and round (see latch_set.lua); changes nothing.
-- KEYS[1] the latch hash.
-- Returns {count left, round id}: {0, 0} when the latch is absent (open), round 0 for a latch with
-- no round (armed by a relock before rounds); a key of another type is an error.
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {0, 0}
end
local left = latch_left(KEYS[1])
if not left then
  return redis.error_reply('WRONGTYPE the key is a hash but not a relock latch')
end
-- Below 2^53 (latch_set.lua): a Lua number holds it exactly.
local round = tonumber(redis.call('HGET', KEYS[1], 'round')) or 0
return {math.max(left, 0), round}
