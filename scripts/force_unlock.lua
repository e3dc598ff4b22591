-- Remove the lock whoever holds it (the fence counter stays).
-- KEYS[1] the lock hash; ARGV[1] the release channel.
-- Returns 1 when a lock was removed, 0 when there was none; a key of another type is an error, untouched.
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return 0
end
if kind ~= 'hash' then
  return redis.error_reply('WRONGTYPE Operation against a key holding the wrong kind of value')
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], '1')
return 1
