-- Set the owner's hold count to a target; at zero, delete the lock and announce the release.
-- KEYS[1] the lock hash. ARGV[1] owner id, ARGV[2] the count left after this release, ARGV[3] the
-- release channel.
--
-- Setting (not decrementing) the count makes a repeated call harmless.
-- Returns 0 when the owner does not hold the lock (nothing changed), 1 when a count is left,
--         2 when the lock was released and the release published.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local target = tonumber(ARGV[2])
if target > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], target)
  return 1
end
redis.call('HDEL', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('PUBLISH', ARGV[3], '1')
end
return 2
