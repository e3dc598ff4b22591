-- Take or re-enter the lock.
-- KEYS[1] the lock hash (field: owner id, value: hold count), KEYS[2] the fence counter.
-- ARGV[1] owner id, ARGV[2] lease in ms, ARGV[3] the hold count the owner has after this acquisition.
--
-- The count is *set* to ARGV[3], never incremented, so a call that runs twice (a resend after a dropped
-- connection) leaves the same state behind. A target of 1 starts a new hold and draws a new fencing
-- token; a reentrant acquisition returns the current counter.
--
-- Returns {1, previous count of this owner (0 if none), token} when granted,
--         {0, remaining ttl in ms} when another owner holds the lock.
local prev = redis.call('HGET', KEYS[1], ARGV[1])
if not prev and redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1])}
end

local target = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], target)
redis.call('PEXPIRE', KEYS[1], ARGV[2])

local token
if target == 1 then
  if redis.call('EXISTS', KEYS[2]) == 0 then
    -- A counter that is missing (first use, or a restart without persistence) starts from the server's
    -- clock in microseconds, which is above every value it can have reached before, as long as the
    -- clock did not step back by more than the time since.
    local t = redis.call('TIME')
    token = tonumber(t[1]) * 1000000 + tonumber(t[2])
    redis.call('SET', KEYS[2], string.format('%.0f', token))
  else
    token = redis.call('INCR', KEYS[2])
  end
else
  token = tonumber(redis.call('GET', KEYS[2]) or '0')
end
return {1, tonumber(prev or '0'), token}
