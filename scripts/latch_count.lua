-- Read a countdown latch's count (see latch_set.lua); changes nothing.
-- KEYS[1] the latch hash.
-- Returns the count left, 0 when the latch is absent (open); a key of another type is an error.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
local n = tonumber(redis.call('HGET', KEYS[1], 'count'))
if not n then
  return redis.error_reply('WRONGTYPE the key is a hash but not a relock latch')
end
local left = n - (redis.call('HLEN', KEYS[1]) - 1)
if left < 0 then
  return 0
end
return left
