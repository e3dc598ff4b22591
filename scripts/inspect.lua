-- Read one lock for operators (relock list / show, LockClient::inspect): changes nothing.
-- KEYS[1] the lock hash; KEYS[2] its fence counter.
-- Returns {type of KEYS[1], fence or false} when the lock key is not a hash (`none`: nobody holds it),
--         {'hash', fence or false, PTTL of the lock, HGETALL of the lock} when it is.
-- A fence of another type reads as false rather than failing the read. One script call, so the
-- holders, the lease and the fence are of the same moment.
local kind = redis.call('TYPE', KEYS[1])['ok']
local fence = false
if redis.call('TYPE', KEYS[2])['ok'] == 'string' then
  fence = redis.call('GET', KEYS[2])
end
if kind ~= 'hash' then
  return {kind, fence}
end
return {kind, fence, redis.call('PTTL', KEYS[1]), redis.call('HGETALL', KEYS[1])}
