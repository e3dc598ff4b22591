-- Read a countdown latch's count (see latch_set.lua); changes nothing.
-- KEYS[1] the latch hash.
-- Returns the count left, 0 when the latch is absent (open); a key of another type is an error.
if not absent_or(KEYS[1], 'hash') then
  return wrong_type()
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local left = latch_left(KEYS[1])
if not left then
  return redis.error_reply('WRONGTYPE the key is a hash but not a relock latch')
end
if left < 0 then
  return 0
end
return left
