-- Set a countdown latch's count, only if it is open (absent, or counted down to zero).
-- KEYS[1] the latch hash: field `count` the count it was set to, and one field `a:<id>` per
-- count_down that arrived (so a resent count_down counts once).
-- ARGV[1] the count, an integer >= 1 (checked by the caller).
-- Returns 1 when set, 0 when the latch is still counting (nothing changed); a key of another type
-- is an error, untouched. Setting (not adding) makes a resend harmless: the second call finds the
-- latch counting and changes nothing.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'none' then
  if kind ~= 'hash' then
    return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
  end
  local n = tonumber(redis.call('HGET', KEYS[1], 'count'))
  if n and n - (redis.call('HLEN', KEYS[1]) - 1) > 0 then
    return 0
  end
  redis.call('DEL', KEYS[1])
end
redis.call('HSET', KEYS[1], 'count', ARGV[1])
return 1
